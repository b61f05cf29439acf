"""Planner statistics from the first minute (issue 40 goal 3, D-542).

A freshly migrated database has no statistics. Autovacuum analyzes a table only once it passed its threshold and
its next round comes (up to `autovacuum_naptime`, a minute by default, later on a busy server); until then the hot
path's statements are planned blind. Measured: the egress claim's slot-head probe read every effect of the account
through the account index, about five times the PostgreSQL CPU per event of the analyzed database
(docs/benchmarks.md). The statistics sweep (beat, every 5 s) analyzes each table that has never been analyzed as
soon as `MIN_CHANGED_ROWS` of its rows changed, and each table analyzed when it held fewer rows than have changed
since (analyzed nearly empty, then grown: the same blind probe, measured at 20 ms of PostgreSQL per event five
bursts after one ANALYZE); otherwise autovacuum keeps the statistics as usual."""
from __future__ import annotations

from django.db import connection

MIN_CHANGED_ROWS = 100


def statistics_analyze_stale(*, min_rows: int = MIN_CHANGED_ROWS) -> list[str]:
    """Analyze every table with at least `min_rows` changed rows and no statistics yet, or statistics taken when it
    had fewer rows than have changed since; the tables analyzed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT connector_analyze_stale(%s)", [min_rows])
        return [name for (name,) in cursor.fetchall()]
