"""The hot-account bench's two baselines: a raw psycopg admission loop on its own tables, and procrastinate's
jobs on the same database (the peer)."""
from __future__ import annotations

import asyncio
import hashlib
import time

from bench.hot_recorder import _sleep_until


PEER_QUEUE_PREFIX = "bench_hot_"

# -- raw baseline -------------------------------------------------------------------------------------------------
RAW_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS raw_epoch (id bigint PRIMARY KEY, state text NOT NULL, digest bytea NOT NULL)",
    ("CREATE TABLE IF NOT EXISTS raw_gate (account_id bigint PRIMARY KEY, mode text NOT NULL, fence bigint NOT NULL,"
     " epoch_id bigint NOT NULL REFERENCES raw_epoch (id), epoch_digest bytea NOT NULL)"),
    ("CREATE TABLE IF NOT EXISTS raw_receipt (id bigserial PRIMARY KEY, account_id bigint NOT NULL,"
     " epoch_id bigint NOT NULL REFERENCES raw_epoch (id) DEFERRABLE INITIALLY DEFERRED, gate_fence bigint NOT NULL,"
     " channel text NOT NULL, payload bytea NOT NULL, payload_digest bytea NOT NULL,"
     " created_at timestamptz NOT NULL DEFAULT now())"),
    ("CREATE TABLE IF NOT EXISTS raw_admission_key (id bigserial PRIMARY KEY, account_id bigint NOT NULL,"
     " channel text NOT NULL, transport_key text NOT NULL,"
     " receipt_id bigint NOT NULL REFERENCES raw_receipt (id) DEFERRABLE INITIALLY DEFERRED,"
     " CONSTRAINT raw_admission_key_unique UNIQUE (account_id, channel, transport_key))"),
    "CREATE TABLE IF NOT EXISTS raw_counter (id bigint PRIMARY KEY, n bigint NOT NULL)",
    "INSERT INTO raw_epoch VALUES (1, 'active', sha256('raw-epoch'::bytea)) ON CONFLICT DO NOTHING",
    "INSERT INTO raw_gate VALUES (1, 'v2_serving', 1, 1, sha256('raw-epoch'::bytea)) ON CONFLICT DO NOTHING",
]

RAW_TABLES = ("raw_admission_key", "raw_receipt", "raw_counter", "raw_gate", "raw_epoch")


def analyze(conninfo: str, say) -> None:
    """ANALYZE after the untimed warm-up, before anything is measured (D-403): the throwaway database was built
    empty, and autovacuum (naptime 60 s) would not have analyzed its tables before the measured window, so the
    planner would still believe the effects, commands and executions tables hold a row or two and plan a join by
    id as a scan of the whole account (seen: the egress claim's candidate read 7-11 ms instead of 0.1-0.5). A
    running system plans with the statistics autovacuum keeps; the window measures that system."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("ANALYZE")
    say(f"ANALYZE after the warm-up: {time.monotonic() - started:.2f} s (D-403)")


def raw_schema_create(conninfo: str, clients: int) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in RAW_SCHEMA:
            conn.execute(statement)
        for i in range(clients + 1):
            conn.execute("INSERT INTO raw_counter VALUES (%s, 0) ON CONFLICT DO NOTHING", [i])


def raw_schema_drop(conninfo: str) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS " + ", ".join(RAW_TABLES))


def _cmd_raw(index: int, command: dict) -> dict:
    """The serving guard's lock-insert-update shape in psycopg 3, one transaction per operation: the epoch row
    FOR SHARE, the gate row FOR SHARE (the guard's order), a receipt-like row, an admission-key-like row under a
    unique constraint, and an UPDATE of the client's counter row."""
    import psycopg
    from psycopg import errors as pg_errors

    from connector.demo import demo_event_body

    counter = 0 if command.get("shared_counter") else index + 1
    latencies, deadlocks, races, failures, n = [], 0, 0, 0, 0
    tag = f"{command['tag']}-r{index}"
    with psycopg.connect(command["conninfo"]) as conn:
        _sleep_until(command["start_at"])
        while time.time() < command["deadline"]:
            key = f"{tag}-{n}"
            n += 1
            body = demo_event_body(key)
            began = time.perf_counter()
            try:
                with conn.transaction():
                    conn.execute("SELECT id, state, digest FROM raw_epoch WHERE id = 1 FOR SHARE").fetchone()
                    gate = conn.execute("SELECT mode, fence, epoch_id, epoch_digest FROM raw_gate "
                                        "WHERE account_id = 1 FOR SHARE").fetchone()
                    if gate[0] != "v2_serving":
                        raise RuntimeError("raw gate not serving")
                    receipt_id = conn.execute(
                        "INSERT INTO raw_receipt (account_id, epoch_id, gate_fence, channel, payload, payload_digest)"
                        " VALUES (1, %s, %s, 'raw', %s, %s) RETURNING id",
                        [gate[2], gate[1], body, hashlib.sha256(body).digest()]).fetchone()[0]
                    conn.execute("INSERT INTO raw_admission_key (account_id, channel, transport_key, receipt_id) "
                                 "VALUES (1, 'raw', %s, %s)", [key, receipt_id])
                    conn.execute("UPDATE raw_counter SET n = n + 1 WHERE id = %s", [counter])
            except pg_errors.DeadlockDetected:
                deadlocks += 1
                continue
            except (pg_errors.UniqueViolation, pg_errors.SerializationFailure):
                races += 1
                continue
            except Exception:  # noqa: BLE001
                failures += 1
                continue
            latencies.append((time.perf_counter() - began) * 1000)
    return {"latencies": latencies, "deadlocks": deadlocks, "races": races, "failures": failures}


# -- peer baseline (procrastinate) -------------------------------------------------------------------------------

def peer_schema_apply(conninfo: str) -> None:
    """procrastinate's schema through its own API (`App.schema_manager.apply_schema_async`) with its psycopg
    connector, once per database."""
    import psycopg
    from procrastinate import App, PsycopgConnector

    with psycopg.connect(conninfo, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()[0] is not None:
            return

    async def apply() -> None:
        app = App(connector=PsycopgConnector(conninfo=conninfo, min_size=1, max_size=1))
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())


def _cmd_peer(index: int, command: dict) -> dict:
    """Defer this process's share of trivial jobs (one transaction each), then work the queue until it is caught
    up (procrastinate worker, concurrency 1, wait=False)."""
    from procrastinate import App, PsycopgConnector

    queue_name = command["queue"]

    async def run() -> dict:
        app = App(connector=PsycopgConnector(conninfo=command["conninfo"], min_size=1, max_size=2))

        @app.task(name="bench_hot_noop", queue=queue_name)
        def noop(i: int) -> None:
            return None

        async with app.open_async():
            _sleep_until(command["start_at"])
            began = time.time()
            for i in range(command["jobs"]):
                await noop.defer_async(i=i)
            deferred = time.time()
            await app.run_worker_async(queues=[queue_name], wait=False, concurrency=1, listen_notify=False,
                                       install_signal_handlers=False, delete_jobs="never",
                                       fetch_job_polling_interval=0.05, name=f"bench-{index}")
            return {"began": began, "deferred": deferred, "ended": time.time(), "jobs": command["jobs"]}

    return asyncio.run(run())
