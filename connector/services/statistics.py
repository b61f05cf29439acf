"""Planner statistics from the first minute (issue 40 goal 3, D-542).

A freshly migrated database has no statistics. Autovacuum analyzes a table only once it passed its threshold and
its next round comes (up to `autovacuum_naptime`, a minute by default, later on a busy server); until then the hot
path's statements are planned blind. Measured: the egress claim's slot-head probe read every effect of the account
through the account index, about five times the PostgreSQL CPU per event of the analyzed database
(docs/benchmarks.md). The statistics sweep (beat, every 5 s) analyzes each table that has never been analyzed as
soon as `FIRST_ANALYZE_ROWS` of its rows changed; after that autovacuum keeps the statistics as usual."""
from __future__ import annotations

from django.db import connection

FIRST_ANALYZE_ROWS = 100


def statistics_first_analyze(*, min_rows: int = FIRST_ANALYZE_ROWS) -> list[str]:
    """Analyze every table with no statistics yet and at least `min_rows` changed rows; the tables analyzed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT connector_analyze_unanalyzed(%s)", [min_rows])
        return [name for (name,) in cursor.fetchall()]
