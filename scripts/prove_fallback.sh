#!/usr/bin/env bash
# Prove the bootstrap fallback without touching this machine's own servers:
#   1. ask the kernel for two free loopback ports P1 (PostgreSQL) and P2 (Redis);
#   2. git clone this repository's committed HEAD into a temporary directory;
#   3. in the clone: DATABASE_URL=postgres://postgres@127.0.0.1:P1/connector
#      REDIS_URL=redis://127.0.0.1:P2/0 FALLBACK_PROOF=1 make test   (PYTEST_ARGS passed through);
#   4. check that private servers run on exactly P1/P2, with their data and pid files under the clone's .data/;
#   5. stop them with `scripts/services.py stop`, check both ports are free again, remove the clone.
# Exits with make test's status (or 3 when make test passed but a check failed).
set -euo pipefail

say() { printf 'prove_fallback: %s\n' "$*"; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$(command -v python3 || true)
[ -n "$PY" ] || { say "python3 is needed on PATH"; exit 2; }

if ! HEAD=$(git -C "$ROOT" rev-parse --verify --quiet HEAD); then
    say "no commit in $ROOT yet: this proof clones the committed HEAD, so commit first"
    exit 2
fi

read -r P1 P2 < <("$PY" - <<'EOF'
import socket
a, b = socket.socket(), socket.socket()
a.bind(("127.0.0.1", 0)); b.bind(("127.0.0.1", 0))
print(a.getsockname()[1], b.getsockname()[1])
EOF
)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/connector-fallback.XXXXXX")
chmod 755 "$WORK"  # as root, the postgres system user must be able to enter the clone
CLONE="$WORK/repo"

stop_servers() {
    if [ -f "$CLONE/scripts/services.py" ] && [ -d "$CLONE/.data" ]; then
        local py="$PY"
        [ -x "$CLONE/.venv/bin/python" ] && py="$CLONE/.venv/bin/python"
        (cd "$CLONE" && "$py" scripts/services.py stop) || say "WARNING: services.py stop failed in $CLONE"
    fi
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [ "${STOPPED:-0}" != 1 ]; then
        say "cleaning up: stopping any private servers in the clone"
        stop_servers
    fi
    rm -rf "$WORK"
    say "removed $WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "ports: PostgreSQL 127.0.0.1:$P1, Redis 127.0.0.1:$P2 (free now: nothing should answer there)"
say "cloning $ROOT at ${HEAD:0:12} into $CLONE"
git clone --quiet --no-hardlinks "$ROOT" "$CLONE"
git -C "$CLONE" checkout --quiet "$HEAD"

say "running make test in the clone (PYTEST_ARGS=${PYTEST_ARGS:-})"
set +e
(
    cd "$CLONE"
    unset JOURNAL_DATABASE_URL DATABASE_ADMIN_URL DATABASE_OWNER_URL JOURNAL_DATABASE_OWNER_URL \
          DJANGO_SETTINGS_MODULE MAKEFLAGS MAKELEVEL MFLAGS VIRTUAL_ENV CONNECTOR_TEST_RUN TEST_DB_SUFFIX
    export DATABASE_URL="postgres://postgres@127.0.0.1:$P1/connector"
    export REDIS_URL="redis://127.0.0.1:$P2/0"
    export FALLBACK_PROOF=1
    export PYTEST_ARGS="${PYTEST_ARGS:-}"
    make test </dev/null
)
MAKE_STATUS=$?
set -e
say "make test exited with status $MAKE_STATUS"

CHECKS=0
fail() { say "CHECK FAILED: $*"; CHECKS=1; }
VPY="$CLONE/.venv/bin/python"
[ -x "$VPY" ] || VPY="$PY"

PG_HOME="$CLONE/.data/pg/$P1"
REDIS_HOME="$CLONE/.data/redis/$P2"
[ -f "$PG_HOME/data/postmaster.pid" ] && say "ok: pid file $PG_HOME/data/postmaster.pid" \
    || fail "no PostgreSQL pid file at $PG_HOME/data/postmaster.pid"
[ -f "$REDIS_HOME/redis.pid" ] && say "ok: pid file $REDIS_HOME/redis.pid" \
    || fail "no Redis pid file at $REDIS_HOME/redis.pid"

if command -v pg_isready >/dev/null; then
    pg_isready -h 127.0.0.1 -p "$P1" -t 5 >/dev/null && say "ok: pg_isready 127.0.0.1:$P1" \
        || fail "pg_isready 127.0.0.1:$P1"
fi

# The servers answering on P1/P2 must be the clone's own: compare their data directories.
if "$VPY" - "$P1" "$P2" "$PG_HOME" "$REDIS_HOME" <<'EOF'
import os, socket, sys
p1, p2, pg_home, redis_home = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ok = True
try:
    import psycopg
    with psycopg.connect(host="127.0.0.1", port=p1, user="postgres", dbname="postgres", connect_timeout=5) as c:
        data_dir = c.execute("SHOW data_directory").fetchone()[0]
        dbs = {r[0] for r in c.execute("SELECT datname FROM pg_database")}
    same = os.path.realpath(data_dir) == os.path.realpath(os.path.join(pg_home, "data"))
    print(f"prove_fallback: {'ok' if same else 'CHECK FAILED'}: PostgreSQL on 127.0.0.1:{p1} serves {data_dir}")
    ok &= same
    missing = {"connector", "connector_journal"} - dbs
    print(f"prove_fallback: {'ok' if not missing else 'CHECK FAILED'}: databases connector, connector_journal"
          + (f" (missing {sorted(missing)})" if missing else " exist"))
    ok &= not missing
except Exception as exc:  # noqa: BLE001
    print(f"prove_fallback: CHECK FAILED: PostgreSQL on 127.0.0.1:{p1}: {exc}")
    ok = False

def redis(*args):
    with socket.create_connection(("127.0.0.1", p2), timeout=5) as s:
        s.sendall(b"".join([b"*%d\r\n" % len(args)] + [b"$%d\r\n%s\r\n" % (len(a), a) for a in args]))
        return s.recv(4096)

try:
    pong = redis(b"PING")
    print(f"prove_fallback: {'ok' if pong == b'+PONG' + bytes([13, 10]) else 'CHECK FAILED'}: "
          f"PING 127.0.0.1:{p2} -> {pong!r}")
    ok &= pong.startswith(b"+PONG")
    reply = redis(b"CONFIG", b"GET", b"dir")
    same = os.path.realpath(redis_home).encode() in reply
    print(f"prove_fallback: {'ok' if same else 'CHECK FAILED'}: Redis on 127.0.0.1:{p2} works in {redis_home}"
          + ("" if same else f" (CONFIG GET dir -> {reply!r})"))
    ok &= same
except OSError as exc:
    print(f"prove_fallback: CHECK FAILED: Redis on 127.0.0.1:{p2}: {exc}")
    ok = False
sys.exit(0 if ok else 1)
EOF
then :; else CHECKS=1; fi

say "stopping the clone's private servers"
STOPPED=1
stop_servers

# Both ports must be free again (nothing accepts connections there).
if "$PY" - "$P1" "$P2" <<'EOF'
import socket, sys, time
busy = []
for port in map(int, sys.argv[1:]):
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            print(f"prove_fallback: ok: 127.0.0.1:{port} is free again")
            break
        if time.monotonic() > deadline:
            busy.append(port)
            break
        time.sleep(0.2)
for port in busy:
    print(f"prove_fallback: CHECK FAILED: something still listens on 127.0.0.1:{port}")
sys.exit(1 if busy else 0)
EOF
then :; else CHECKS=1; fi

if [ "$MAKE_STATUS" -ne 0 ]; then
    say "RESULT: make test failed (status $MAKE_STATUS); fallback checks $([ $CHECKS = 0 ] && echo passed || echo FAILED)"
    exit "$MAKE_STATUS"
fi
if [ "$CHECKS" -ne 0 ]; then
    say "RESULT: make test passed but the fallback checks FAILED"
    exit 3
fi
say "RESULT: make test passed on private PostgreSQL 127.0.0.1:$P1 and private Redis 127.0.0.1:$P2; both stopped"
exit 0
