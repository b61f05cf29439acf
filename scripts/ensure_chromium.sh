#!/usr/bin/env bash
# The browser tests drive Debian's Chromium through Playwright (no browser download). Install it when missing.
set -euo pipefail
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then exit 0; fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser tests (apt-get install chromium)..."
  export DEBIAN_FRONTEND=noninteractive
  # A second `make test` starting beside the first waits for its install instead of failing on the dpkg lock.
  APT="apt-get -o DPkg::Lock::Timeout=600"
  $APT install -y --no-install-recommends chromium >/dev/null 2>&1 \
    || { $APT update >/dev/null 2>&1 && $APT install -y --no-install-recommends chromium >/dev/null; }
  [ -x "$CHROMIUM" ] && exit 0
fi
echo "The browser tests need Chromium at $CHROMIUM: install it with 'sudo apt-get install chromium'" \
     "(or set CHROMIUM=/path/to/chromium)." >&2
exit 1
