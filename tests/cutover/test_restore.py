"""Begin validation, cold abort, the full V1 restore and the once-active refusal, against the real PostgreSQL
(real pg_dump / pg_restore of the test database) and the real V1 (`v1` app)."""
from __future__ import annotations

import pytest
from django.db import connections

from config.routers import JOURNAL_DB
from connector.choices import GateMode
from connector.models import AuditRecord, OrderingLane
from cutover.choices import DecisionState, RestoreAttemptState
from cutover.errors import ColdAbortRefused, RestorePointInvalid, RestoreRefused
from cutover.models import RestoreAttempt, ServiceCutoverAttempt
from cutover.services.decision import decision_choose_activation, decision_commit_activation, decision_read
from cutover.services.restore import cutover_begin_validation, cutover_cold_abort, restore_run
from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
from tests.cutover.restore_fixtures import TX, restore_env, validating_world  # noqa: F401
from tests.cutover.approval_helpers import approve
from tests.cutover.restore_helpers import ACTOR, accept, drained_world, v1_cursors
from v1 import runtime
from v1.models import GenerationState, V1Barrier, V1HighWater, V1OutboundEffect, V1ProcessGeneration, V1WorkItem
from tests import dbroles


def v1_state() -> dict:
    return {"cursors": v1_cursors(),
            "high_waters": sorted(V1HighWater.objects.values_list("account_key", "partition", "high_water")),
            "effects": sorted(V1OutboundEffect.objects.values_list("request_key", "state", "remote_id")),
            "items": sorted(V1WorkItem.objects.values_list("transport_key", "state"))}


def outcome(world) -> str:
    return ServiceCutoverAttempt.objects.get(attempt_key=world.key).outcome


# -- begin validation ------------------------------------------------------------------------------------------

@TX
def test_begin_validation_opens_the_decision_then_moves_every_gate_to_v2_validating():
    """Proves: CV2-12-053, CV2-12-056 and decision 11 (a rehearsed, drift-free restore point; the
    CutoverDecision rollback_open; every frozen gate v1_drained -> v2_validating, audited with the attempt key;
    V2 stays disabled: no lane, no epoch activated)."""
    world = validating_world()
    assert world.modes() == {GateMode.V2_VALIDATING}
    assert decision_read(world.key).state == DecisionState.ROLLBACK_OPEN
    audits = AuditRecord.objects.filter(action="gate_begin_validation")
    assert audits.count() == len(world.accounts)
    assert all(world.key in a.reason for a in audits)
    assert not OrderingLane.objects.exists()
    world.epoch.refresh_from_db()
    assert world.epoch.state == "verified"


@TX
def test_begin_validation_needs_a_rehearsed_restore_point():
    """Proves: CV2-12-052 (no validation on an unrehearsed restore point; gates stay v1_drained, no decision)."""
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    with pytest.raises(RestorePointInvalid, match="never rehearsed"):
        cutover_begin_validation(attempt_key=world.key, actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED} and decision_read(world.key) is None


@TX
def test_live_drift_after_rehearsal_refuses_validation():
    """Proves: CV2-12-053 (the live content digest is rechecked before validation starts)."""
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    restore_point_rehearse(attempt_key=world.key, actor="op")
    approve("restore_point", world.key)
    V1HighWater.objects.update(high_water=999)
    with pytest.raises(RestorePointInvalid, match="drifted"):
        cutover_begin_validation(attempt_key=world.key, actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED} and decision_read(world.key) is None


# -- cold abort ------------------------------------------------------------------------------------------------

@TX
def test_cold_abort_starts_a_new_generation_reopens_barriers_and_serves_v1():
    """Proves: CV2-12-072, CV2-12-082 (v1_drained before any V2 mutation -> v1_serving with a NEW generation of
    the exact release; the terminated one stays terminated; barriers reopen; outcome cold_aborted), CV2-12-048,
    CV2-12-049 (in v1_drained, with the V1ShutdownCertificate stored, no V1 generation runs and the terminated one
    may execute nothing: the certificate is evidence, not an authorization; V1 stays the recoverable authority)."""
    from cutover.models import V1ShutdownCertificate
    from v1.errors import V1GenerationRefused

    world = drained_world()
    assert world.modes() == {GateMode.V1_DRAINED}
    assert V1ShutdownCertificate.objects.filter(attempt__attempt_key=world.key).exists()
    assert not V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).exists()
    effects_before = v1_state()["effects"]
    with pytest.raises(V1GenerationRefused):
        runtime.work_once(world.v1_generation)
    assert v1_state()["effects"] == effects_before
    new_generation = cutover_cold_abort(attempt_key=world.key, actor=ACTOR)
    assert new_generation != world.v1_generation
    generations = dict(V1ProcessGeneration.objects.values_list("generation_id", "state"))
    assert generations == {world.v1_generation: GenerationState.TERMINATED, new_generation: GenerationState.RUNNING}
    assert world.modes() == {GateMode.V1_SERVING}
    assert not V1Barrier.objects.filter(closed=True).exists()
    assert outcome(world) == "cold_aborted"
    item, created = accept(world.accounts[0].account_key, "evt-0-a", 10)  # a duplicate stays recognized
    assert not created


@TX
def test_cold_abort_is_refused_once_validation_began():
    """Proves: CV2-12-082 (after v2_validating only the full restore returns to V1), CV2-12-057 (a candidate that
    fails validation leaves the service offline, every gate v2_validating, until the full restore below runs)."""
    world = validating_world()
    with pytest.raises(ColdAbortRefused, match="validation began"):
        cutover_cold_abort(attempt_key=world.key, actor=ACTOR)
    assert world.modes() == {GateMode.V2_VALIDATING} and outcome(world) == "open"


@TX
def test_cold_abort_is_refused_before_the_drain_completes():
    """Proves: CV2-12-072 (cold abort only from v1_drained)."""
    from tests.cutover.restore_helpers import build_owners, drain, open_attempt, seed_v1
    world = build_owners("c-")
    seed_v1(world)
    drain(world, actions=("halt_v1", "stop_v1"))
    open_attempt(world)
    with pytest.raises(ColdAbortRefused, match="v1_drained"):
        cutover_cold_abort(attempt_key=world.key, actor=ACTOR)
    assert world.modes() == {GateMode.V1_STOPPED}
    assert V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).count() == 0


# -- full restore ----------------------------------------------------------------------------------------------

@TX
def test_full_restore_returns_the_exact_snapshot_and_a_new_v1_generation_resumes():
    """Proves: CV2-12-073, CV2-12-074, CV2-12-075, CV2-12-084, CV2-12-094, CV2-12-054 (decision restoring_v1 first;
    default replaced atomically by the dump and verified against every frozen digest; recovery receipt and v1_restored durable in
    the journal before V1 starts; a NEW generation; cursors, idempotency, high-waters and terminal effects as
    captured; gates v1_serving; outcome v1_restored), CV2-12-057 (a candidate whose validation failed, having
    scribbled on `default`, is undone by the full restore contract)."""
    world = validating_world()
    captured = v1_state()
    # validation scribbles on `default` (what a restore must undo)
    V1HighWater.objects.update(high_water=999)
    runtime.barriers_install()
    row = restore_run(attempt_key=world.key, actor=ACTOR)
    connections.close_all()
    assert row.state == RestoreAttemptState.V1_SERVING
    assert RestoreAttempt.objects.using(JOURNAL_DB).count() == 1
    assert bytes(row.recovery_digest) and bytes(row.restored_content_digest) == bytes(world.point.content_digest)
    assert decision_read(world.key).state == DecisionState.V1_RESTORED
    assert v1_state() == captured
    assert world.modes() == {GateMode.V1_SERVING}
    assert outcome(world) == "v1_restored"
    generations = dict(V1ProcessGeneration.objects.values_list("generation_id", "state"))
    assert generations[world.v1_generation] == GenerationState.TERMINATED
    assert generations[row.v1_generation_id] == GenerationState.RUNNING and row.v1_generation_id != world.v1_generation
    assert not V1Barrier.objects.filter(closed=True).exists()
    # the new generation resumes: a duplicate transport key is recognized, new work continues past the high-water
    account = world.accounts[0].account_key
    _, created = accept(account, "evt-0-b", 20)
    assert not created
    _, created = accept(account, "evt-0-c", 30)
    assert created
    runtime.drain(row.v1_generation_id)
    assert V1HighWater.objects.get(account_key=account).high_water == 30
    # resuming a completed restore changes nothing
    assert restore_run(attempt_key=world.key, actor=ACTOR).pk == row.pk


@TX
def test_an_idle_superuser_session_does_not_stop_the_restore():
    """Proves: CV2-12-073 (the restore runs as the database owner, which may terminate every product session but
    not a superuser's: an administrator's idle console on the database is left alone and the restore completes)."""
    import psycopg
    world = validating_world()
    settings = connections["default"].settings_dict
    console = psycopg.connect(host=settings["HOST"], port=settings["PORT"], dbname=settings["NAME"],
                              user=settings["USER"], password=settings["PASSWORD"] or None, autocommit=True)
    try:
        assert console.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
        row = restore_run(attempt_key=world.key, actor=ACTOR)
        connections.close_all()
        assert row.state == RestoreAttemptState.V1_SERVING
        assert console.execute("SELECT 1").fetchone() == (1,)  # still alive: never terminated
    finally:
        console.close()


@TX
def test_restore_is_refused_once_activation_won_the_decision():
    """Proves: CV2-12-076, CV2-12-098 (activation chose first: no restore, no downgrade, nothing written)."""
    world = validating_world()
    decision_choose_activation(world.key)
    with pytest.raises(RestoreRefused, match="activation"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    decision_commit_activation(world.key)
    with pytest.raises(RestoreRefused, match="activation"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    assert not RestoreAttempt.objects.using(JOURNAL_DB).exists()
    assert world.modes() == {GateMode.V2_VALIDATING}


@TX
def test_restore_is_refused_once_any_epoch_became_active():
    """Proves: CV2-12-076 (a live active epoch refuses the restore even with the decision still open)."""
    world = validating_world()
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute('ALTER TABLE "connector_servingepoch" DISABLE TRIGGER ALL')
        cursor.execute('UPDATE "connector_servingepoch" SET state = %s WHERE id = %s', ["active", world.epoch.pk])
        cursor.execute('ALTER TABLE "connector_servingepoch" ENABLE TRIGGER ALL')
        dbroles.admin_off(cursor)
    with pytest.raises(RestoreRefused, match="became active"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    assert decision_read(world.key).state == DecisionState.ROLLBACK_OPEN
    assert not RestoreAttempt.objects.using(JOURNAL_DB).exists()


@TX
def test_restore_without_validation_points_to_cold_abort():
    """Proves: CV2-12-082 (a restore needs the decision; before v2_validating the cold abort applies)."""
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    restore_point_rehearse(attempt_key=world.key, actor="op")
    with pytest.raises(RestoreRefused, match="cold abort"):
        restore_run(attempt_key=world.key, actor=ACTOR)


@TX
def test_a_restored_database_that_does_not_verify_stops_before_the_receipt(monkeypatch):
    """Proves: CV2-12-074 (a digest mismatch after pg_restore records no receipt, does not complete the decision
    and starts no V1; the RestoreAttempt stays `started` and a rerun retries)."""
    from cutover.services import restore as restore_service
    world = validating_world()
    real = restore_service.recompute_digests

    def cursors_differ(point):
        digests = real(point)
        now, frozen = digests["cursors"]
        return {**digests, "cursors": (b"\xff" * 32, frozen)}

    monkeypatch.setattr(restore_service, "recompute_digests", cursors_differ)
    with pytest.raises(RestorePointInvalid, match="cursors"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    connections.close_all()
    row = RestoreAttempt.objects.using(JOURNAL_DB).get(attempt_key=world.key)
    assert row.state == RestoreAttemptState.STARTED and row.recovery_digest is None
    assert decision_read(world.key).state == DecisionState.RESTORING_V1
    assert not V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).exists()
    assert world.modes() == {GateMode.V1_DRAINED}
    monkeypatch.setattr(restore_service, "recompute_digests", real)
    assert restore_run(attempt_key=world.key, actor=ACTOR).pk == row.pk
    connections.close_all()
    assert world.modes() == {GateMode.V1_SERVING}


@TX
def test_a_missing_dump_refuses_the_restore_before_the_decision():
    """Proves: CV2-12-053, CV2-12-073 (no restore from a dump that no longer verifies; the decision stays open)."""
    import os
    world = validating_world()
    os.remove(world.point.dump_path)
    with pytest.raises(RestorePointInvalid, match="missing"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    assert decision_read(world.key).state == DecisionState.ROLLBACK_OPEN
    assert world.modes() == {GateMode.V2_VALIDATING}


@TX
def test_a_pg_restore_failing_midway_exposes_no_partial_state():
    """Proves: CV2-12-073 (the restore of `default` is one transaction: a restore that breaks part-way through,
    after `--clean` already dropped constraints, leaves the previous database exactly as it was; the RestoreAttempt
    stays `started`, nothing serves)."""
    from cutover.services import pg_snapshot
    world = validating_world()
    V1HighWater.objects.update(high_water=999)
    with connections["default"].cursor() as cursor:  # an object the dump does not know blocks one DROP TABLE
        dbroles.admin_on(cursor)  # (the administrator stages it: the application role creates nothing)
        cursor.execute("CREATE VIEW hc_blocker AS SELECT * FROM v1_v1highwater")
        dbroles.admin_off(cursor)
    before = pg_snapshot.digests_of()
    with pytest.raises(RestorePointInvalid, match="pg_restore"):
        restore_run(attempt_key=world.key, actor=ACTOR)
    connections.close_all()
    assert pg_snapshot.digests_of() == before
    assert world.modes() == {GateMode.V2_VALIDATING}
    assert RestoreAttempt.objects.using(JOURNAL_DB).get(attempt_key=world.key).state == RestoreAttemptState.STARTED
    assert not V1ProcessGeneration.objects.filter(state=GenerationState.RUNNING).exists()
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("DROP VIEW hc_blocker")
        dbroles.admin_off(cursor)
