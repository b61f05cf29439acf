"""Preflight measures what the seed asks (dependency deadlines, owner latencies, a representative restore rehearsal
on the candidate schema) and the offline verification before maintenance compares the V2 schema and binary with
the ones frozen in the readiness certificate. Against the real V1 and a real scratch database."""
from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from connector.choices import GateMode
from connector.selectors import owners as owner_reads
from cutover.errors import CutoverPreflightRefused, V2ArtifactMismatch
from cutover.models import CutoverReadinessCertificate, MaintenanceBarrierReceipt
from cutover.services import pg_snapshot, v1_shutdown as sd, v2_artifacts
from tests import dbroles
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import ACTOR, BUDGETS, build_v1_world
from v1.models import V1Barrier
from v1.owner import V1Owner


def _open(world, key="att-1"):
    sd.cutover_open(attempt_key=key, configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)


def _refused(budgets) -> CutoverPreflightRefused:
    with pytest.raises(CutoverPreflightRefused) as info:
        sd.cutover_certify(attempt_key="att-1", budgets=budgets, actor=ACTOR)
    assert not CutoverReadinessCertificate.objects.exists()
    return info.value


def _scratch_databases() -> list[str]:
    with pg_snapshot.snapshot_connect("postgres") as conn:
        return [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                                           [connection.settings_dict["NAME"] + "_preflight_%"]).fetchall()]


@pytest.mark.django_db
def test_preflight_measures_deadlines_and_owner_latencies_and_rehearses_a_restore(monkeypatch):
    """Preflight measures the nearest and latest dependency deadline of the open accepted V1 work (the drain lasts
    until the latest: one 1,000 s away breaches a 600 s drain budget), times each owner's authority read (a Catalog
    read slowed to 0.7 s breaches a 3 s activation-readback budget), and runs a representative restore rehearsal:
    the live database with the candidate schema dumped, restored into a scratch database, read back (digests and
    the V2 schema equal) and dropped. A rehearsal whose restored copy differs refuses. Every refusal names its
    stable reason code and writes nothing; the certificate freezes the measurements, the rehearsal's timings and
    the projections scaled from them. Proves: CV2-12-016"""
    world = build_v1_world()
    _open(world)
    real_read = owner_reads.catalog_view_read_exact

    def slow_catalog(**kwargs):
        time.sleep(0.7)
        return real_read(**kwargs)

    monkeypatch.setattr(owner_reads, "catalog_view_read_exact", slow_catalog)
    refused = _refused({**BUDGETS, "activation_readback": 3})
    assert refused.context["reasons"] == ["over_budget:activation_readback"], refused.detail
    monkeypatch.undo()

    world.accept(0, "waits", 1)
    world.accept(1, "depends", 1)
    from v1 import runtime
    runtime.accept(account_key=world.keys[1], source_key="webhook", transport_key="deadline", payload=b"{}",
                   partition="p", position=2, dependency_deadline=timezone.now() + timedelta(seconds=1000))
    refused = _refused(BUDGETS)
    assert refused.context["reasons"] == ["over_budget:drain"], refused.detail

    original = pg_snapshot.restore_into

    def lossy_restore(path, database):  # the restored copy loses a table: the readback must see it
        original(path, database)
        params = {k: v for k, v in pg_snapshot.connection_params(database).items() if v}
        with psycopg.connect(**params, autocommit=True) as c:
            c.execute("DROP TABLE cutover_orderingbaseline CASCADE")

    monkeypatch.setattr(pg_snapshot, "restore_into", lossy_restore)
    refused = _refused({**BUDGETS, "drain": 2500})
    assert refused.context["reasons"] == ["restore_rehearsal_failed"], refused.detail
    monkeypatch.undo()
    assert _scratch_databases() == []  # every rehearsal dropped its scratch database, failed or not

    certificate = sd.cutover_certify(attempt_key="att-1", budgets={**BUDGETS, "drain": 2500}, actor=ACTOR)
    measured = certificate.measurements
    assert 900 < measured["latest_dependency_deadline_s"] <= 1000
    assert measured["nearest_dependency_deadline_s"] == pytest.approx(measured["latest_dependency_deadline_s"], abs=1)
    assert {"v1", "configuration", "catalog", "credential"} <= set(measured["owner_latency_ms"])
    assert all(ms > 0 for ms in measured["owner_latency_ms"].values())
    rehearsal = measured["rehearsal"]
    assert rehearsal["restore_s"] > 0 and rehearsal["dump_s"] > 0 and rehearsal["tables"] > 50
    assert rehearsal["v2_schema_digest"] == bytes(certificate.v2_schema_digest).hex()
    projections = certificate.projections
    assert projections["drain"] == pytest.approx(2 * measured["latest_dependency_deadline_s"])
    scale = max(1.0, measured["database_bytes"] / rehearsal["database_bytes"])
    assert projections["full_restore"] == pytest.approx(rehearsal["restore_s"] * scale * 2)
    assert projections["offline_validation"] == pytest.approx(
        (5 + sum(measured["owner_latency_ms"].values()) / 1000) * 2)
    assert _scratch_databases() == []


@pytest.mark.django_db
def test_maintenance_verifies_the_certified_v2_schema_and_binary_offline(monkeypatch, tmp_path):
    """The readiness certificate freezes the V2 schema digest (applied migrations and PostgreSQL's description of
    every V2 table) and the V2 binary digest (every file of the V2 code). Before any barrier closes, and again under
    the certificate and gate locks, maintenance recomputes both with V2 disabled: a changed code file or a changed
    V2 table, or a route whose conformance proof (source-order facts) is no longer the certified one refuses with
    V2_ARTIFACT_MISMATCH, no barrier closes and no gate moves; the certified ones pass.
    Proves: CV2-12-019"""
    extra = tmp_path / "plugin"
    extra.mkdir()
    (extra / "module.py").write_text("VALUE = 1\n")
    real_dirs = v2_artifacts.code_dirs
    monkeypatch.setattr(v2_artifacts, "code_dirs", lambda: [*real_dirs(), extra])
    world = build_v1_world()
    _open(world)
    certificate = sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
    assert bytes(certificate.v2_binary_digest) == v2_artifacts.binary_digest()
    assert bytes(certificate.v2_schema_digest) == v2_artifacts.schema_digest()
    approve("readiness_certificate", "att-1")

    def refused(what: str) -> None:
        with pytest.raises(V2ArtifactMismatch) as info:
            sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
        assert info.value.code == "V2_ARTIFACT_MISMATCH" and what in info.value.detail, info.value.detail
        assert not MaintenanceBarrierReceipt.objects.exists()
        assert not V1Barrier.objects.filter(closed=True).exists()
        assert world.modes() == {GateMode.V1_SERVING}

    (extra / "module.py").write_text("VALUE = 2\n")
    refused("v2_binary_digest")
    (extra / "module.py").write_text("VALUE = 1\n")
    with dbroles.as_admin(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE connector_auditrecord ADD COLUMN drift integer")
    refused("v2_schema_digest")
    with dbroles.as_admin(), connection.cursor() as cursor:
        cursor.execute("ALTER TABLE connector_auditrecord DROP COLUMN drift")
    # A route's conformance proof (its source-order facts and their digest) no longer the certified one.
    real_contracts = V1Owner.route_contracts
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: [
        dataclasses.replace(c, source_order=dataclasses.replace(c.source_order, comparator="integer.v2"),
                            disposition_proof_digest=dataclasses.replace(c.source_order,
                                                                         comparator="integer.v2").digest)
        if c.source_order is not None else c for c in real_contracts(self)])
    refused("route conformance proofs")
    monkeypatch.setattr(V1Owner, "route_contracts", real_contracts)
    assert sd.maintenance_close(attempt_key="att-1", actor=ACTOR) == 2
    assert world.modes() == {GateMode.HALTING_V1}
