"""`/healthz` (the process answers) and `/readyz` (it can serve: both databases reachable, every migration applied,
the serving state readable, commits durable where the settings require it). No sign-in: a load balancer or an
orchestrator probes them; they reveal no data beyond the name of the failing check."""
from __future__ import annotations

from collections.abc import Callable
from functools import cache

from django.db import connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from connector.selectors.rows import AccountServingGate

DATABASES = ("default", "journal")


@cache
def _migrations_on_disk() -> dict[tuple[str, str], tuple[tuple[str, str], ...]]:
    """Every migration the code ships (key -> the keys it replaces), read from disk once per process."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return {key: tuple(migration.replaces) for key, migration in loader.disk_migrations.items()}


def unapplied_migrations(alias: str) -> list[str]:
    """The migrations on disk that database `alias` has not recorded (a squashed one counts as applied when every
    migration it replaces is): one SELECT on django_migrations, instead of building MigrationExecutor's graph on
    every probe. Django records every migration on every database, routed away or not."""
    applied = set(MigrationRecorder(connections[alias]).applied_migrations())
    return sorted(f"{app}.{name}" for (app, name), replaces in _migrations_on_disk().items()
                  if (app, name) not in applied and not (replaces and set(replaces) <= applied))


def _database(alias: str) -> Callable[[], str]:
    def check() -> str:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT 1")
        return "reachable"
    return check


def _migrations() -> str:
    for alias in DATABASES:
        missing = unapplied_migrations(alias)
        if missing:
            raise RuntimeError(f"{len(missing)} unapplied on {alias}, first {missing[0]}")
    return "applied"


#: Server settings without which a committed transaction may be lost in a crash of PostgreSQL or its host.
DURABILITY_SQL = ("SELECT current_setting('fsync'), current_setting('full_page_writes'), "
                  "current_setting('synchronous_commit')")


def commit_durability(alias: str) -> list[str]:
    """What keeps database `alias` from committing durably for this process's sessions (empty: durable): the
    server's fsync or full_page_writes off, or the session's synchronous_commit off (D-410)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(DURABILITY_SQL)
        fsync, full_page_writes, synchronous_commit = cursor.fetchone()
    readings = {"fsync": fsync, "full_page_writes": full_page_writes, "synchronous_commit": synchronous_commit}
    return [f"{name} {value}" for name, value in readings.items() if value == "off"]


def _durability() -> str:
    """Every database's durability; failing only where CONNECTOR_REQUIRE_DURABLE_COMMITS (production) says so."""
    from django.conf import settings

    lacking = {alias: commit_durability(alias) for alias in DATABASES}
    lacking = {alias: found for alias, found in lacking.items() if found}
    if not lacking:
        return "durable (fsync, full_page_writes and synchronous_commit on)"
    detail = "not durable: " + "; ".join(f"{alias} {', '.join(found)}" for alias, found in lacking.items())
    if settings.CONNECTOR_REQUIRE_DURABLE_COMMITS:
        raise RuntimeError(detail)
    return detail + " (allowed: CONNECTOR_REQUIRE_DURABLE_COMMITS is off)"


def _serving() -> str:
    return f"{AccountServingGate.objects.count()} gates"


CHECKS: dict[str, Callable[[], str]] = {
    "database_default": _database("default"),
    "database_journal": _database("journal"),
    "migrations": _migrations,
    "serving_state": _serving,
    "durable_commits": _durability,
}


def readiness() -> tuple[bool, dict[str, dict[str, str]]]:
    """Every check in order; a failing check is named with its error class and message (no stop at the first:
    an operator sees at once whether only the journal is down)."""
    results, ok = {}, True
    for name, check in CHECKS.items():
        try:
            results[name] = {"status": "ok", "detail": check()}
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; the probe names it
            ok = False
            results[name] = {"status": "failing", "detail": f"{type(exc).__name__}: {exc}"[:300]}
            _discard()
    return ok, results


def _discard() -> None:
    """A kept connection that failed is closed now, so the next probe reconnects instead of reusing it."""
    for alias in DATABASES:
        try:
            if connections[alias].connection is not None and not connections[alias].is_usable():
                connections[alias].close()
        except Exception:  # noqa: BLE001 - closing a broken connection may itself fail
            pass


@never_cache
@require_GET
def healthz(request):
    """The process is alive and serving requests; touches no database."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    """200 with every check when ready; 503 naming the failing checks otherwise."""
    ok, checks = readiness()
    failing = [name for name, result in checks.items() if result["status"] != "ok"]
    body = {"status": "ok" if ok else "failing", "failing": failing, "checks": checks}
    return JsonResponse(body, status=200 if ok else 503)
