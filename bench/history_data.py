"""The retained history of `bench history` (and of the metrics-plans bench): receipts with their whole chain,
generated in bulk SQL on a throwaway database."""
from __future__ import annotations

import time
from collections.abc import Callable

from django.db import connection

from connector.demo import DEMO_CHANNEL, HISTORY_BODY_SQL

CHANNEL = DEMO_CHANNEL
HISTORY_PARTITIONS = 1000  # history records: each retained event updates one of this many CRM records (lanes)
HISTORY_BATCH = 50_000
HISTORY_KEY_PREFIX = "hist-"

Progress = Callable[[str], None]


def _reserve_ids(cursor, table: str, count: int) -> int:
    """Reserve `count` consecutive ids of `table`'s identity sequence; returns the first."""
    cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
    sequence = cursor.fetchone()[0]
    cursor.execute("SELECT nextval(%s)", [sequence])
    first = cursor.fetchone()[0]
    if count > 1:
        cursor.execute("SELECT setval(%s, %s)", [sequence, first + count - 1])
    return first


# One statement per table; %(lo)s..%(hi)s is the batch of global history indexes g, and each table's ids are
# base + (g - lo) in a reserved range, so children reference parents without a lookup. Every row satisfies the
# table's constraints (unique keys, check constraints) and the immutable/append-only triggers (BEFORE UPDATE
# only: inserts are allowed). Bodies look like a real 1-event webhook delivery.
HISTORY_SQL = [
    # lanes of the partitions this batch touches (upsert: the high-water only grows, the fence advances)
    """
    INSERT INTO connector_orderinglane (epoch_id, account_id, route, route_version, partition, contract,
        baseline, baseline_origin, high_water, high_water_tie, active_execution_id, state, halt_reason, gap_since,
        fence, changed_at)
    SELECT %(epoch)s, %(account)s, %(route)s, 1, 'hist-r' || (g %% %(parts)s), 'latest_source_position', NULL,
        'empty_new_partition', max(g / %(parts)s + 1), NULL, NULL, 'open', '', NULL, 1, now()
    FROM generate_series(%(lo)s, %(hi)s) g GROUP BY g %% %(parts)s
    ON CONFLICT (epoch_id, account_id, route, route_version, partition) DO UPDATE
        SET high_water = GREATEST(connector_orderinglane.high_water, EXCLUDED.high_water),
            fence = connector_orderinglane.fence + 1, changed_at = now()
    """,
    "DROP TABLE IF EXISTS bench_batch",
    """
    CREATE TEMP TABLE bench_batch ON COMMIT DROP AS
    SELECT g, g - %(lo)s AS o, 'hist-r' || (g %% %(parts)s) AS rkey, (g / %(parts)s + 1) AS pos,
        convert_to(__HISTORY_BODY_SQL__, 'UTF8') AS body,
        now() - interval '400 days' + g * interval '10 seconds' AS at
    FROM generate_series(%(lo)s, %(hi)s) g
    """,
    """
    INSERT INTO connector_receipt (id, account_id, epoch_id, epoch_digest, gate_fence, kind, channel, payload,
        payload_digest, component_count, replay_request_id, created_at)
    SELECT %(receipt)s + o, %(account)s, %(epoch)s, %(epoch_digest)s, %(fence)s, 'transport', %(route)s, body,
        sha256(body), 1, NULL, at
    FROM bench_batch
    """,
    """
    INSERT INTO connector_receiptadmissionkey (id, account_id, channel, transport_key, receipt_id, tombstone_id)
    SELECT %(key)s + o, %(account)s, %(route)s, %(key_prefix)s || g, %(receipt)s + o, NULL FROM bench_batch
    """,
    """
    INSERT INTO connector_event (id, account_id, epoch_id, receipt_id, route, event_kind, source_locator,
        occurred_at, source_event_key, payload, payload_digest, ordering_contract, contract_digest, partition,
        position_kind, position, position_bytes, tie_breaker, grouping_key, replay_request_id, predecessor_id,
        created_at)
    SELECT %(event)s + o, %(account)s, %(epoch)s, %(receipt)s + o, %(route)s, 'record.updated', rkey,
        '2025-01-01T00:00:00Z', 'hist-ev-' || g, p.payload, sha256(p.payload), 'latest_source_position',
        sha256(convert_to('bench-contract', 'UTF8')), rkey, 'integer', pos, convert_to(pos::text, 'UTF8'),
        convert_to('hist-ev-' || g, 'UTF8'), '', NULL, NULL, at
    FROM bench_batch, LATERAL (SELECT convert_to('{"email":"r' || (g %% %(parts)s) || '@example.com","name":"Record '
        || (g %% %(parts)s) || ' v' || pos || '"}', 'UTF8') AS payload) p
    """,
    """
    INSERT INTO connector_receiptcomponent (id, receipt_id, ordinal, payload, payload_digest, disposition,
        event_id, reason_code)
    SELECT %(component)s + o, %(receipt)s + o, 0, body, sha256(body), 'event', %(event)s + o, '' FROM bench_batch
    """,
    """
    INSERT INTO connector_projection (id, account_id, epoch_id, route, route_version, identity_digest, event_id,
        window_id, lane_id, position, tie_breaker, input, input_digest, suppress_external_effects,
        execution_generation, lane_status, created_at)
    SELECT %(projection)s + o, %(account)s, %(epoch)s, %(route)s, 1,
        sha256(convert_to('bench-projection:' || %(account)s || ':' || g, 'UTF8')), %(event)s + o, NULL, l.id, pos,
        convert_to('hist-ev-' || g, 'UTF8'), body, sha256(body), false, 1, 'minted', at
    FROM bench_batch JOIN connector_orderinglane l ON l.epoch_id = %(epoch)s AND l.account_id = %(account)s
        AND l.route = %(route)s AND l.route_version = 1 AND l.partition = rkey
    """,
    """
    INSERT INTO connector_execution (id, projection_id, generation, account_id, epoch_id, lane_id, state,
        command_id, execution_ref, execution_ref_digest, lease_holder, lease_expires_at, lease_fence,
        attempt_count, result_outcome, result_digest, runtime_receipt, quarantine_reason, created_at, changed_at)
    SELECT %(execution)s + o, %(projection)s + o, 1, %(account)s, %(epoch)s, p.lane_id, 'completed',
        'cmd-hist-' || %(account)s || '-' || g, convert_to('ref:' || g, 'UTF8'),
        sha256(convert_to('ref:' || g, 'UTF8')), '', NULL, 1, 1, 'applied',
        sha256(convert_to('result:' || g, 'UTF8')), convert_to('receipt:' || g, 'UTF8'), '', at, at
    FROM bench_batch JOIN connector_projection p ON p.id = %(projection)s + o
    """,
    """
    INSERT INTO connector_executionattempt (id, execution_id, ordinal, holder, lease_fence, claimed_at,
        lease_expires_at)
    SELECT %(attempt)s + o, %(execution)s + o, 1, 'bench-history', 1, at, at + interval '60 seconds'
    FROM bench_batch
    """,
    """
    INSERT INTO connector_applicationresult (id, command_id, execution_ref_digest, outcome, result_digest, receipt,
        detail, committed_at)
    SELECT %(result)s + o, 'cmd-hist-' || %(account)s || '-' || g, sha256(convert_to('ref:' || g, 'UTF8')),
        'applied', sha256(convert_to('result:' || g, 'UTF8')), convert_to('receipt:' || g, 'UTF8'), 'applied', at
    FROM bench_batch
    """,
    """
    INSERT INTO connector_crmrecord (account_id, record_key, fields, version, last_command_id, updated_at)
    SELECT %(account)s, rkey, '{}'::jsonb, count(*), 'cmd-hist-' || %(account)s || '-' || max(g), now()
    FROM bench_batch GROUP BY rkey
    ON CONFLICT (account_id, record_key) DO UPDATE
        SET version = connector_crmrecord.version + EXCLUDED.version, last_command_id = EXCLUDED.last_command_id
    """,
]
HISTORY_SQL = [statement.replace("__HISTORY_BODY_SQL__", HISTORY_BODY_SQL) for statement in HISTORY_SQL]
TABLES_PER_HISTORY_ROW = 8  # receipt, key, event, component, projection, execution, attempt, result


def history_count(account_id: int) -> int:
    """Retained history rows of the account (admission keys with the history prefix)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM connector_receiptadmissionkey WHERE account_id = %s "
                       "AND transport_key LIKE %s", [account_id, HISTORY_KEY_PREFIX + "%"])
        return cursor.fetchone()[0]


def generate_history(*, account, epoch, start: int, count: int, progress: Progress | None = None,
                     batch: int = HISTORY_BATCH) -> int:
    """Insert `count` retained receipts (indexes start..start+count-1) with their admission keys, components,
    events, projections, completed executions, attempts and application results, in batches of bulk SQL.
    Returns the number of rows inserted (all tables)."""
    from django.db import transaction

    if not connection.in_atomic_block:
        # A fresh session: PostgreSQL caches the plans of its foreign-key checks per session, and plans made
        # while the tables were tiny (sequential scans) would make each check of a large batch scan the table.
        connection.close()
    gate = account.serving_gate
    rows = 0
    began = time.monotonic()
    done = 0
    while done < count:
        n = min(batch, count - done)
        lo = start + done
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            params = {"lo": lo, "hi": lo + n - 1, "parts": HISTORY_PARTITIONS, "account": account.pk,
                      "epoch": epoch.pk, "epoch_digest": bytes(epoch.digest), "fence": gate.fence, "route": CHANNEL,
                      "key_prefix": HISTORY_KEY_PREFIX}
            for name, table in (("receipt", "connector_receipt"), ("key", "connector_receiptadmissionkey"),
                                ("event", "connector_event"), ("component", "connector_receiptcomponent"),
                                ("projection", "connector_projection"), ("execution", "connector_execution"),
                                ("attempt", "connector_executionattempt"),
                                ("result", "connector_applicationresult")):
                params[name] = _reserve_ids(cursor, table, n)
            for statement in HISTORY_SQL:
                cursor.execute(statement, params)
        done += n
        rows += n * TABLES_PER_HISTORY_ROW
        if progress is not None:
            elapsed = time.monotonic() - began
            progress(f"  history {done:,}/{count:,} receipts ({rows:,} rows, "
                     f"{rows / elapsed if elapsed else 0:,.0f} rows/s, {elapsed:,.1f} s)")
    return rows


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def retained_counts(account_id: int) -> dict[str, int]:
    counts = {}
    with connection.cursor() as cursor:
        for name, table in (("receipts", "connector_receipt"), ("admission_keys", "connector_receiptadmissionkey"),
                            ("events", "connector_event"), ("projections", "connector_projection"),
                            ("executions", "connector_execution")):
            cursor.execute(f"SELECT count(*) FROM {table} WHERE account_id = %s", [account_id])
            counts[name] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM connector_applicationresult")
        counts["application_results"] = cursor.fetchone()[0]
    return counts
