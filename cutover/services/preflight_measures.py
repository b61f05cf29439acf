"""What preflight measures and how it projects the budgeted phases from it (seed "Operational liveness and
maintenance admission", CV2-12-016):

- the V1 workload (the owner port): accepted backlog, open partitions, live leases, ambiguous effects, database
  size, and the nearest and latest dependency deadlines of the open accepted work;
- owner latencies: the measured round trip of each owner's authority read (the V1 owner's generation read, the
  Catalog view, the L2 configuration generation with its receipt, one credential generation with its secret
  version), timed here, in milliseconds;
- a representative restore rehearsal on the candidate schema: the live database (which carries the candidate V2
  schema) is dumped from one exported snapshot, restored into a scratch database, read back (schema and content
  digests, and the V2 schema digest equal to the candidate's) and dropped; the dump and restore are timed.

`project` turns them into conservative projections (seconds) of every budgeted phase: the drain lasts at least
until the latest dependency deadline of accepted work (V1 keeps such an item open until its dependency resolves or
its deadline passes), barrier closure and validation include the owners' measured round trips, and the capture,
rehearsal and full restore scale the rehearsal's measured durations by the projected snapshot size. A failed
rehearsal, an unreadable owner or any projection over its budget refuses preflight with a stable reason code
(`CutoverPreflightRefused.context["reasons"]`, docs/errors.md).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
import uuid

from connector.errors import ConnectorError
from connector.selectors import owners as owner_reads
from connector.selectors.rows import ServingEpoch
from cutover.errors import RestorePointInvalid
from cutover.services import pg_snapshot, v2_artifacts

SECONDS_PER_BACKLOG_ITEM = 0.05
SAFETY_FACTOR = 2
BARRIERS = 3  # authoring, ingress, root outbound: each close is one V1 owner round trip at least
REHEARSAL_FAILED = "restore_rehearsal_failed"
OWNER_UNREADABLE = "owner_unreadable"


def over_budget(phase: str) -> str:
    """The stable reason code of a projection over its budget."""
    return f"over_budget:{phase}"


# -- owner latencies -------------------------------------------------------------------------------------------

def _timed(read) -> float:
    started = time.perf_counter()
    read()
    return round((time.perf_counter() - started) * 1000.0, 3)


def owner_reads_of(attempt, owner) -> dict[str, object]:
    """Each owner's authority read for the attempt (callables, by owner name)."""
    configuration = attempt.configuration
    reads: dict[str, object] = {"v1": owner.current_generation,
                                "configuration": lambda: owner_reads.service_configuration_read(
                                    generation_id=configuration.generation_id)}
    view = configuration.catalog_view
    if view is not None:
        reads["catalog"] = lambda: owner_reads.catalog_view_read_exact(view_key=view.view_key, revision=view.revision)
    credential = (ServingEpoch.objects.filter(pk=attempt.candidate_epoch_id)
                  .values_list("credential_proofs__credential_generation__generation_id", flat=True)
                  .exclude(credential_proofs__isnull=True).order_by("credential_proofs__ordinal").first())
    if credential is not None:
        reads["credential"] = lambda: owner_reads.credential_generation_read(generation_id=credential)
    return reads


def owner_latencies(attempt, owner) -> tuple[dict[str, float], list[str]]:
    """(milliseconds by owner, problems): an owner whose authority read fails is a problem, not a latency."""
    latencies: dict[str, float] = {}
    problems: list[str] = []
    for name, read in owner_reads_of(attempt, owner).items():
        try:
            latencies[name] = _timed(read)
        except ConnectorError as exc:
            problems.append(f"owner {name} unreadable: {exc.code}")
    return latencies, problems


def measure(attempt, owner, keys: list[str]):
    """The V1 workload with the owners' measured latencies."""
    workload = owner.measure(keys)
    latencies, problems = owner_latencies(attempt, owner)
    return dataclasses.replace(workload, owner_latency_ms=latencies), problems


# -- the representative restore rehearsal ---------------------------------------------------------------------

def rehearse(attempt_key: str) -> dict:
    """Dump the live database (candidate schema) from one snapshot, restore it into a scratch database, read it
    back and drop it. Returns the timed figures; raises RestorePointInvalid/Refused on any failure or mismatch."""
    live_schema = v2_artifacts.schema_digest()
    database = pg_snapshot.connection_params()["dbname"]
    scratch = f"{database}_preflight_{uuid.uuid4().hex[:8]}"[:63]
    with tempfile.TemporaryDirectory(prefix="preflight-rehearsal-") as directory:
        path = os.path.join(directory, f"{attempt_key}.dump")
        started = time.perf_counter()
        digests, database_bytes = pg_snapshot.snapshot_and_dump(path, check=_database_bytes)
        dump_s = time.perf_counter() - started
        dump_bytes = os.path.getsize(path)
        pg_snapshot.create_scratch(scratch)
        try:
            started = time.perf_counter()
            pg_snapshot.restore_into(path, scratch)
            restore_s = time.perf_counter() - started
            restored = pg_snapshot.digests_of(scratch)
            with pg_snapshot.snapshot_connect(scratch) as conn, conn.cursor() as cursor:
                restored_v2 = v2_artifacts.schema_digest(cursor)
        finally:
            pg_snapshot.drop_database(scratch)
    if restored.schema != digests.schema or restored.content != digests.content:
        raise RestorePointInvalid("the rehearsal's restored copy differs from its snapshot (schema or content)")
    if restored_v2 != live_schema:
        raise RestorePointInvalid("the rehearsal's restored copy does not carry the candidate V2 schema")
    return {"dump_s": round(dump_s, 3), "restore_s": round(restore_s, 3), "dump_bytes": dump_bytes,
            "database_bytes": database_bytes, "tables": restored.tables, "rows": restored.rows,
            "v2_schema_digest": restored_v2.hex()}


def _database_bytes(cursor, snapshot_id) -> int:
    cursor.execute("SELECT pg_database_size(current_database())")
    return cursor.fetchone()[0]


# -- projections ------------------------------------------------------------------------------------------------

def project(workload, budgets: dict, rehearsal: dict) -> dict[str, float]:
    """Conservative projections (seconds) of each budgeted phase from the measured workload, owner latencies and
    the representative rehearsal (its durations scaled by the projected snapshot size)."""
    latency_s = {name: ms / 1000.0 for name, ms in (workload.owner_latency_ms or {}).items()}
    owners_s = sum(latency_s.values())
    scale = max(1.0, workload.database_bytes / max(1, rehearsal["database_bytes"]))
    drain = max(workload.accepted_backlog * SECONDS_PER_BACKLOG_ITEM, workload.latest_dependency_deadline_s or 0.0)
    return {
        "barrier_closure": (1.0 + BARRIERS * latency_s.get("v1", 0.0)) * SAFETY_FACTOR,
        "drain": drain * SAFETY_FACTOR,
        "baseline_capture": (workload.open_partitions + 1) * 0.01 * SAFETY_FACTOR,
        "recovery_point_capture": rehearsal["dump_s"] * scale * SAFETY_FACTOR,
        "restore_rehearsal": (rehearsal["dump_s"] + rehearsal["restore_s"]) * scale * SAFETY_FACTOR,
        "offline_validation": (5.0 + owners_s) * SAFETY_FACTOR,
        "activation_readback": (1.0 + owners_s) * SAFETY_FACTOR,
        "full_restore": rehearsal["restore_s"] * scale * SAFETY_FACTOR,
    }


def workload_dict(workload) -> dict:
    return {"accepted_backlog": workload.accepted_backlog, "open_partitions": workload.open_partitions,
            "live_leases": workload.live_leases, "ambiguous_effects": workload.ambiguous_effects,
            "database_bytes": workload.database_bytes,
            "nearest_dependency_deadline_s": workload.nearest_dependency_deadline_s,
            "latest_dependency_deadline_s": workload.latest_dependency_deadline_s,
            "owner_latency_ms": dict(sorted((workload.owner_latency_ms or {}).items()))}
