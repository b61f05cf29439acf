"""`make test` runs the suite as two shards (scripts/test_shards.py): every test file is in exactly one shard, and
the shards use distinct test databases and Redis databases, so running them side by side changes no result."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("test_shards_script", ROOT / "scripts" / "test_shards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_test_file_is_in_exactly_one_shard():
    shards = _module().shards()
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert files
    for path in files:
        owners = [n for n, shard in enumerate(shards, start=1)
                  if any(path == entry or path.startswith(entry + "/") for entry in shard)]
        assert len(owners) == 1, (path, owners)


def test_each_shard_gets_its_own_redis_database():
    module = _module()
    assert module._redis_db("redis://127.0.0.1:6379/0", 1) == "redis://127.0.0.1:6379/1"
    assert module._redis_db("redis://127.0.0.1:6379/3", 2) == "redis://127.0.0.1:6379/5"
    assert module._redis_db("redis://127.0.0.1:6379", 2) == "redis://127.0.0.1:6379/2"


def test_each_runner_keeps_its_own_shard_logs(tmp_path):
    """Two `make test` in one checkout write their shard logs side by side (`test-shard-N-<runner pid>.log`); a
    runner removes only the logs of runners that are gone. Proves: issue 37 item 9"""
    import os
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine, gone, other = (tmp_path / f"test-shard-1-{os.getpid()}.log", tmp_path / f"test-shard-2-{dead.pid}.log",
                         tmp_path / "test-shard-1.log")
    for log in (mine, gone, other):
        log.write_text("x")
    _module()._remove_old_logs(tmp_path)
    assert (mine.exists(), gone.exists(), other.exists()) == (True, False, True)
