"""Several test runs on one PostgreSQL server and one Redis (issue 37 item 9, D-451): each run's test databases end
with its run id, `<checkout digest>_<pid>` (config/django/test.py), and every key it writes to Redis begins with
`connector-test-<run id>:`. A run removes its Redis keys when it ends; a run that was killed leaves its databases
and keys behind, and the next run from the same checkout drops those whose pytest process is gone."""
from __future__ import annotations

import os
import re

import psycopg
import redis
from django.conf import settings
from django.db import connections


def run_id() -> str:
    return settings.TEST_RUN


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def abandoned(names: list[str], checkout: str) -> list[str]:
    """The databases among `names` that a run of this checkout (digest `checkout`) created and whose pytest process
    no longer exists."""
    pattern = re.compile(rf"^test_\w*_{re.escape(checkout)}_(\d+)$")
    out = []
    for name in names:
        found = pattern.match(name)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            out.append(name)
    return out


def _checkout() -> str | None:
    """This checkout's digest, or None for an explicit CONNECTOR_TEST_RUN (its owner manages what it leaves)."""
    checkout = run_id().rsplit("_", 1)[0]
    return checkout if re.fullmatch(r"[0-9a-f]{6}", checkout) else None


def _delete_keys(client: redis.Redis, pattern: str, keep=lambda key: False) -> int:
    doomed = [key for key in client.scan_iter(pattern, count=1000) if not keep(key)]
    for start in range(0, len(doomed), 500):
        client.delete(*doomed[start:start + 500])
    return len(doomed)


def drop_redis_keys(*, abandoned_only: bool) -> int:
    """Remove this run's Redis keys (at its end), or (`abandoned_only`) the keys of this checkout's runs whose
    pytest process is gone. Redis unreachable: nothing to do."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_connect_timeout=2, socket_timeout=10)
    try:
        if not abandoned_only:
            return _delete_keys(client, f"{settings.CONNECTOR_REDIS_KEY_PREFIX}*")
        checkout = _checkout()
        if checkout is None:
            return 0
        live = re.compile(rf"^connector-test-{checkout}_(\d+):")

        def keep(key: bytes) -> bool:
            found = live.match(key.decode(errors="replace"))
            return found is None or _alive(int(found.group(1)))

        return _delete_keys(client, f"connector-test-{checkout}_*", keep)
    except redis.RedisError:
        return 0
    finally:
        client.close()


def drop_abandoned_databases() -> list[str]:
    """Drop the test databases of this checkout's killed runs (as the administrator the suite connects as)."""
    checkout = _checkout()
    if checkout is None:
        return []
    s = connections["default"].settings_dict
    with psycopg.connect(host=s.get("HOST") or None, port=s.get("PORT") or None, user=s.get("USER") or None,
                         password=s.get("PASSWORD") or None, dbname="postgres", autocommit=True) as conn:
        names = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'test\\_%'")]
        gone = abandoned(names, checkout)
        for name in gone:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return gone
