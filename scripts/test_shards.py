"""`make test` on the machine's cores: the suite in two shards run side by side, each a whole pytest run on its own
test databases (TEST_DB_SUFFIX) and its own Redis database, so nothing one shard writes is seen by the other. Each
shard is also a test run of its own (config/django/test.py: its run id, from the checkout and its pid, ends its
test databases' names and begins its Redis keys), so two `make test` at once, from two checkouts or one, do not
meet either (D-451).

Shard 1 is the connector and effects suites plus the smaller folders (fast, many database-only tests), the crash and
fault harnesses and the fresh-clone fallback proof; shard 2 is every other entry of tests/ (the process-heavy suites:
cutover with pg_dump/pg_restore and its preflight restore rehearsals, hostile HTTP, the browser, observability).
On 2026-12-08 (load 2-3) the shards took 947 s and 743 s with observability in shard 1; it moved to shard 2. On 2026-12-05 (issue
22's merge) the shards took 619 s and 842 s with faults and the fallback proof in shard 2; they moved to shard 1.
Shard 2 is computed as "everything not in shard 1", so a new folder or file is never left out. Each shard's output
goes to .data/test-shard-N-<pid>.log (pid: this runner's; the logs of runners no longer running are removed at
start) and is printed when it ends; the exit status is non-zero if either shard failed. `make test PYTEST_ARGS=...`
(a selection) runs one plain pytest instead (see the Makefile).

Measured on this 2-core machine (docs/benchmarks.md, "The test suite and the benches"): one run took 20:56; the
two halves alone took 5:51 and 12:44."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARD_ONE = ("tests/connector", "tests/effects", "tests/governance", "tests/v1", "tests/conformance",
             "tests/scaleout", "tests/crash", "tests/test_harness.py", "tests/test_requirements_coverage.py",
             "tests/faults", "tests/test_bootstrap_fallback.py")


def shards() -> list[list[str]]:
    tests = ROOT / "tests"
    everything = sorted(p.relative_to(ROOT).as_posix() for p in tests.iterdir()
                        if (p.is_dir() and p.name != "__pycache__" and any(p.rglob("test_*.py")))
                        or (p.is_file() and p.name.startswith("test_") and p.suffix == ".py"))
    one = [p for p in SHARD_ONE if (ROOT / p).exists()]
    two = [p for p in everything if p not in one]
    return [one, two]


def _redis_db(url: str, offset: int) -> str:
    match = re.match(r"^(redis://[^/]+)(?:/(\d+))?$", url)
    if not match:
        return url
    return f"{match.group(1)}/{int(match.group(2) or 0) + offset}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_old_logs(logs: Path) -> None:
    """The shard logs of runners that are gone (a runner beside this one keeps its own)."""
    for log in logs.glob("test-shard-*-*.log"):
        found = re.fullmatch(r"test-shard-\d+-(\d+)\.log", log.name)
        if found and not _alive(int(found.group(1))):
            log.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    extra = argv[1:]
    logs = ROOT / ".data"
    logs.mkdir(exist_ok=True)
    _remove_old_logs(logs)
    base_suffix = os.environ.get("TEST_DB_SUFFIX", "")
    redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    running = []
    began = time.monotonic()
    for n, paths in enumerate(shards(), start=1):
        env = dict(os.environ, TEST_DB_SUFFIX=f"{base_suffix}_shard{n}", REDIS_URL=_redis_db(redis, n))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        log = logs / f"test-shard-{n}-{os.getpid()}.log"
        handle = log.open("w")
        command = [sys.executable, "-m", "pytest", *extra, *paths]
        print(f"shard {n}: {' '.join(paths)} (log {log.relative_to(ROOT)})", flush=True)
        running.append((n, subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT),
                        handle, log))
    status = 0
    for n, process, handle, log in running:
        code = process.wait()
        handle.close()
        print(f"\n===== shard {n} ({'passed' if code == 0 else f'FAILED, exit {code}'}) =====", flush=True)
        print(log.read_text(), flush=True)
        status = status or code
    print(f"both shards done in {time.monotonic() - began:.0f} s: {'green' if status == 0 else 'RED'}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
