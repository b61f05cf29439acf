"""The restore rehearsal's scratch database is dropped even while a session the owner may not terminate is in it
(an autovacuum worker analyzing the freshly restored copy, seen on a loaded machine: issue 37 item 9, D-453)."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connections

from cutover.services import pg_snapshot
from tests import dbroles


@pytest.mark.django_db
def test_a_scratch_database_is_dropped_once_a_session_the_owner_cannot_end_leaves():
    """A session of a role the owner is not a member of (standing in for an autovacuum worker, which no role but
    a superuser may terminate) is in the scratch database when the rehearsal drops it: the drop waits for it to
    leave instead of failing. Proves: issue 37 item 9"""
    s = connections["default"].settings_dict
    name = f"{s['NAME']}_scratchdrop"[:63]
    pg_snapshot.create_scratch(name)
    try:
        try:
            blocker = psycopg.connect(host=s.get("HOST") or None, port=s.get("PORT") or None, dbname=name,
                                      user=dbroles.APP, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:  # a server that does not trust loopback logins of the role
            pytest.skip(f"cannot log in as {dbroles.APP}: {exc}")
        leaves = threading.Timer(1.0, blocker.close)
        leaves.start()
        began = time.monotonic()
        pg_snapshot.drop_database(name)
        waited = time.monotonic() - began
        leaves.join()
        assert waited >= 0.5, "the session was still there: the drop must have waited for it"
        with pg_snapshot.snapshot_connect("postgres", autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name]).fetchone()[0] == 0
    finally:
        with pg_snapshot.snapshot_connect("postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
