"""The WAL one transaction wrote, summed from its own records with pg_walinspect (PostgreSQL 15+), read from a
second (autocommit) session.

`pg_get_wal_records_info(start, end)` reads flushed WAL only. PostgreSQL 15 refuses a start beyond the flush LSN
("cannot accept future start LSN"), an end beyond it ("cannot accept future end LSN"), an empty range ("WAL start
LSN must be less than end LSN"), and a range whose first record is not wholly flushed ("could not find a valid
record after ..."). With `synchronous_commit = off` (the test suite's sessions, config.django.test; the private server ran that
way before D-410) a COMMIT does not flush: the flush LSN trails the insert LSN by up to `wal_writer_delay`, and it can stop in the middle
of a record (the WAL writer writes whole pages).

So `wal_of` first closes the range itself (`flush_marker`): it writes a marker record and commits it with
`synchronous_commit = on` for that one transaction (the COMMIT returns once WAL up to its commit record is flushed),
makes sure the flush LSN has passed the marker, and reads `[start, marker end)`: every record in it is complete and
flushed, whatever the server's setting, at a page or segment boundary too. A start at or beyond the marker's end is
an empty range: zero records, not an error.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

MARKER_PREFIX = "bench-wal"
FLUSH_TIMEOUT_SECONDS = 30.0


class WalNotFlushed(RuntimeError):
    """The flush LSN did not pass the marker record in time (the server cannot flush its WAL)."""


@dataclass
class Wal:
    bytes: int | None  # every WAL record of the transaction's xid (incl. full-page images), None without walinspect
    records: int | None
    fpi_bytes: int | None
    server_bytes: int  # pg_wal_lsn_diff over the whole call: every session's WAL on the server (noisy)
    by_relation: dict[str, int] = field(default_factory=dict)  # table (its indexes and TOAST included) -> bytes


# The transaction's records, each attributed to the table its first block belongs to (an index or a TOAST relation
# counts for its table); records without a block (commit, ...) to their resource manager. The range is closed by
# the caller at a flushed record boundary (flush_marker).
WAL_BY_RELATION_SQL = """
WITH w AS (
    SELECT record_length, fpi_length, resource_manager,
           (regexp_match(block_ref, 'rel [0-9]+/[0-9]+/([0-9]+)'))[1]::oid AS filenode
    FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn) WHERE xid = %(xid)s::text::xid)
SELECT CASE WHEN c.oid IS NULL THEN w.resource_manager
            WHEN o.oid IS NOT NULL THEN o.relname || ' (toast)'
            ELSE t.relname END AS relation,
       count(*), sum(w.record_length), sum(w.fpi_length)
FROM w
LEFT JOIN pg_class c ON c.relfilenode = w.filenode AND c.relfilenode <> 0
LEFT JOIN pg_index i ON i.indexrelid = c.oid
LEFT JOIN pg_class t ON t.oid = coalesce(i.indrelid, c.oid)
LEFT JOIN pg_class o ON o.reltoastrelid = t.oid
GROUP BY 1 ORDER BY 3 DESC
"""


def insert_lsn(observer) -> str:
    """Where the next WAL record will be written: the start of a measured range."""
    return observer.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]


def flush_marker(observer, *, timeout: float = FLUSH_TIMEOUT_SECONDS) -> str:
    """Write a marker record (a transactional logical message: it takes an xid, so its COMMIT flushes) in a
    transaction of its own with synchronous_commit on, whatever the server's setting, and return the marker's end
    LSN once the server's flush LSN has reached it. Every record that began before the marker, an aborted or
    asynchronously committed transaction's included, is then wholly flushed and readable."""
    with observer.transaction():
        observer.execute("SET LOCAL synchronous_commit = on")
        (end,) = observer.execute("SELECT pg_logical_emit_message(true, %s, 'flush')::text",
                                  [MARKER_PREFIX]).fetchone()
    deadline = time.monotonic() + timeout
    while not observer.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", [end]).fetchone()[0]:
        if time.monotonic() > deadline:  # a synchronous COMMIT has flushed: only a broken server gets here
            raise WalNotFlushed(f"the WAL flush LSN did not reach {end} within {timeout:g} s")
        time.sleep(0.005)
    return end


def wal_of(observer, start_lsn: str, xid: int, *, server_bytes: int, enabled: bool) -> Wal:
    """The WAL records transaction `xid` wrote from `start_lsn` on (it must have ended: committed, aborted or its
    backend killed). Zero for an empty range; None figures without pg_walinspect."""
    if not enabled:
        return Wal(None, None, None, server_bytes)
    end = flush_marker(observer)
    if observer.execute("SELECT %s::pg_lsn >= %s::pg_lsn", [start_lsn, end]).fetchone()[0]:
        return Wal(bytes=0, records=0, fpi_bytes=0, server_bytes=server_bytes)
    rows = observer.execute(WAL_BY_RELATION_SQL, {"start": start_lsn, "end": end, "xid": str(xid)}).fetchall()
    return Wal(bytes=sum(int(r[2]) for r in rows), records=sum(int(r[1]) for r in rows),
               fpi_bytes=sum(int(r[3]) for r in rows), server_bytes=server_bytes,
               by_relation={r[0]: int(r[2]) for r in rows})


def retain_wal(observer) -> None:
    """A temporary physical replication slot reserving WAL from now on, for this session's lifetime: a checkpoint
    during a long run must not recycle the segments pg_walinspect still has to read."""
    import psycopg

    with contextlib.suppress(psycopg.Error):  # no free slot or no privilege: a very long run may then lose WAL
        observer.execute("SELECT pg_create_physical_replication_slot(%s, true, true)",
                         [f"bench_act_{os.getpid()}_{int(time.time() * 1000) % 10**9}"])
