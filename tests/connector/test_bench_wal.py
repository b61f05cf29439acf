"""The activation bench's WAL figure (pg_walinspect) is measured, not refused, for a range the server has not flushed
yet and for an empty range: PostgreSQL 15 refuses a future start LSN, an empty range and a range whose first record
is not wholly flushed, and with synchronous_commit off (the test suite's own sessions, D-410) a COMMIT does
not flush (CV2-14-006: the activation's WAL figure is a budgeted figure)."""
from __future__ import annotations

import pytest

from bench.activation_world import _ensure_extensions, _observer
from bench.wal import insert_lsn, wal_of

ROUNDS = 25  # each one a fresh race against the WAL writer; today's code lost it in (nearly) every round


@pytest.fixture
def async_observer(transactional_db, administrator):
    """A second session committing as the test suite's sessions do: synchronous_commit off (the WAL writer
    flushes every wal_writer_delay, 200 ms, and may stop in the middle of a record)."""
    assert _ensure_extensions()["pg_walinspect"], "pg_walinspect is needed to measure the activation's WAL"
    observer = _observer()
    observer.execute("SET synchronous_commit = off")
    try:
        yield observer
    finally:
        observer.close()


def _small_transaction(observer, payload: str) -> int:
    """A transaction that writes two WAL records (a transactional logical message and its COMMIT) and commits
    asynchronously; returns its xid."""
    with observer.transaction():
        (xid,) = observer.execute("SELECT pg_current_xact_id()::xid::text::bigint").fetchone()
        observer.execute("SELECT pg_logical_emit_message(true, 'test-wal', %s)", [payload])
    return xid


def test_wal_of_an_unflushed_range_counts_every_record_of_the_transaction(async_observer):
    """The transaction's records are written but (with synchronous_commit off) not flushed when the WAL is read:
    wal_of still returns exactly its message and COMMIT records, round after round, including a round that starts
    at a WAL segment boundary (after pg_switch_wal). Today's code read up to pg_current_wal_flush_lsn() and was
    refused ("cannot accept future start LSN", "could not find a valid record after ..."). Proves: CV2-14-006"""
    for round_ in range(ROUNDS):
        if round_ == 0:
            async_observer.execute("SELECT pg_switch_wal()")
        start = insert_lsn(async_observer)
        xid = _small_transaction(async_observer, f"round {round_} " + "x" * 200)
        wal = wal_of(async_observer, start, xid, server_bytes=0, enabled=True)
        assert wal.records == 2, (round_, wal)
        assert set(wal.by_relation) == {"LogicalMessage", "Transaction"}, (round_, wal)
        assert wal.by_relation["LogicalMessage"] > 200 and wal.fpi_bytes == 0
        assert wal.bytes == sum(wal.by_relation.values())


def test_wal_of_an_empty_range_is_zero_not_an_error(async_observer):
    """A range with nothing in it — its start at or beyond every flushed record — measures zero records and zero
    bytes; a transaction outside the range does not count. Today's code was refused ("cannot accept future start
    LSN"). Proves: CV2-14-006"""
    xid = _small_transaction(async_observer, "before the range")
    (future,) = async_observer.execute(
        "SELECT (pg_current_wal_insert_lsn() + 1073741824::numeric)::text").fetchone()
    wal = wal_of(async_observer, future, xid, server_bytes=0, enabled=True)
    assert (wal.bytes, wal.records, wal.fpi_bytes, wal.by_relation) == (0, 0, 0, {})
    # the same transaction over a range that holds it is counted (the zero above is not a blind default)
    start = insert_lsn(async_observer)
    xid = _small_transaction(async_observer, "inside the range")
    assert wal_of(async_observer, start, xid, server_bytes=0, enabled=True).records == 2
