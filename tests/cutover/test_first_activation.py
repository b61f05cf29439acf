"""The first activation of a V1 -> V2 service cutover, on a service that really drained its V1: the barrier set,
the dual-approved activation decision, one activation transaction, crashes at every boundary (a real process
SIGKILLed), the race with a RestoreAttempt, and the publication/revocation guards."""
from __future__ import annotations

import pytest
from django.db import connections

from connector.choices import EpochState, GateMode
from connector.errors import ApprovalMissing
from connector.models import ServingEpoch
from connector.services import gates as gate_services
from connector.services import owners
from cutover.choices import BarrierSetState, DecisionState
from cutover.errors import ActivationLost, BarrierSetRefused, CutoverPhaseRefused, PublicationBarrierHeld
from cutover.models import AttemptOutcome, ServiceCutoverAttempt
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from tests.concurrency import run_concurrently
from tests.cutover.v1_world import ACTOR, approve_activation, build_v1_world, to_validating

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)
BOUNDARIES = ("activation.after_decision", "activation.before_commit", "activation.after_commit",
              "activation.after_v2_committed")


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def held_world():
    world = build_v1_world()
    world.accept(0, "k1", 1)
    to_validating(world)
    fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    row = fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    assert row.state == BarrierSetState.HELD
    return world


def all_or_nothing(world) -> str:
    """'serving' (epoch active, every gate v2_serving on it) or 'offline' (epoch verified, every gate
    v2_validating); anything else fails."""
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    modes = world.modes()
    if epoch.state == EpochState.ACTIVE and modes == {GateMode.V2_SERVING}:
        return "serving"
    assert epoch.state == EpochState.VERIFIED and modes == {GateMode.V2_VALIDATING}, (epoch.state, modes)
    return "offline"


@TX
def test_activation_needs_the_dual_approval_then_commits_everything_at_once():
    """Without two approvals the commit is refused and nothing moves; with them the set is held -> committed ->
    released, the epoch active, every gate v2_serving on it, the decision v2_committed and the attempt closed.
    Proves: CV2-12-058, CV2-12-059, CV2-12-064, CV2-12-067, CV2-12-068, CV2-12-070"""
    world = held_world()
    with pytest.raises(ApprovalMissing):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert all_or_nothing(world) == "offline"
    assert decisions.decision_read("att-1").state == DecisionState.ROLLBACK_OPEN
    approve_activation(world.epoch.epoch_id)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert all_or_nothing(world) == "serving"
    assert decisions.decision_read("att-1").state == DecisionState.V2_COMMITTED
    attempt = ServiceCutoverAttempt.objects.get(attempt_key="att-1")
    assert attempt.outcome == AttemptOutcome.V2_COMMITTED
    assert fa.barrier_set_of(attempt).state == BarrierSetState.RELEASED
    assert fa.first_activation_commit(attempt_key="att-1", actor=ACTOR).state == EpochState.ACTIVE  # idempotent


@TX
@pytest.mark.parametrize("point", BOUNDARIES)
def test_a_crash_at_every_boundary_is_all_or_nothing_and_resumes(point, run_child):
    """A coordinator process SIGKILLed at each boundary leaves either everything offline (verified epoch, every
    gate v2_validating) or everything serving — never a part — and the resumed coordinator finishes with the same
    decision. Proves: CV2-12-063, CV2-12-085, CV2-12-096"""
    world = held_world()
    approve_activation(world.epoch.epoch_id)
    child = run_child("""
        from connector.actors import Actor
        from cutover.services import first_activation
        first_activation.first_activation_commit(attempt_key="att-1", actor=Actor.system("coordinator"))
        emit(done=True)
    """, point)
    assert child.killed, child.stderr
    state = all_or_nothing(world)
    decision = decisions.decision_read("att-1").state
    if point in ("activation.after_decision", "activation.before_commit"):
        assert state == "offline" and decision == DecisionState.ACTIVATING_V2  # restore no longer wins
    else:
        assert state == "serving"
        assert decision == (DecisionState.V2_COMMITTED if point == "activation.after_v2_committed"
                            else DecisionState.ACTIVATING_V2)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert all_or_nothing(world) == "serving"
    assert decisions.decision_read("att-1").state == DecisionState.V2_COMMITTED


@TX
def test_a_crash_before_the_decision_leaves_restore_authorized():
    """Before the decision CAS nothing happened: the decision is still rollback_open (a restore may win) and
    every gate offline. Proves: CV2-12-096"""
    world = held_world()
    assert all_or_nothing(world) == "offline"
    assert decisions.decision_read("att-1").state == DecisionState.ROLLBACK_OPEN


@TX
def test_activation_losing_the_race_to_restore_records_nothing_and_releases():
    """A RestoreAttempt that wins `rollback_open -> restoring_v1` first makes the activation record no commit and
    release its held set; the stale coordinator cannot reacquire. Run as a real race on separate connections: one
    branch wins, never both. Proves: CV2-12-066, CV2-12-085, CV2-12-095, CV2-12-097"""
    world = held_world()
    approve_activation(world.epoch.epoch_id)
    opened = decisions.decision_read("att-1")
    activate, restore = run_concurrently(
        [lambda: fa.first_activation_commit(attempt_key="att-1", actor=ACTOR),
         lambda: decisions.decision_choose_restore("att-1", expected_fence=opened.fence)],
        expect=Exception)
    results = {"activate": activate, "restore": restore}
    state = all_or_nothing(world)
    decision = decisions.decision_read("att-1").state
    if decision == DecisionState.RESTORING_V1:
        assert state == "offline" and isinstance(results["activate"], ActivationLost)
        assert fa.barrier_set_of(ServiceCutoverAttempt.objects.get()).state == BarrierSetState.RELEASED
        with pytest.raises(BarrierSetRefused):
            fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    else:
        assert state == "serving" and decision == DecisionState.V2_COMMITTED
        assert isinstance(results["restore"], Exception)


@TX
def test_a_held_set_refuses_publications_and_an_urgent_revocation_aborts_only_while_rollback_is_open():
    """While the set is held, a Catalog/configuration/credential publication is refused (retryable); an urgent
    credential revocation commits and releases the set while the decision is rollback_open (the activation is
    aborted), and activation then refuses. Proves: CV2-12-064, CV2-12-065"""
    world = held_world()
    with pytest.raises(PublicationBarrierHeld):
        owners.credential_generation_create(
            generation_id="late.g1", credential_identity="crm-api", account_key=world.keys[0], secret=b"s" * 16,
            transport_config={"base_url": "http://127.0.0.1:1", "auth": "bearer"}, actor=ACTOR)
    generation_id = world.configuration.credential_mappings.first().credential_generation.generation_id
    gate_services.credential_gate_transition(generation_id=generation_id, action="revoke", expected_fence=None,
                                             actor=ACTOR, reason="key leaked")
    attempt = ServiceCutoverAttempt.objects.get()
    assert fa.barrier_set_of(attempt).state == BarrierSetState.RELEASED
    approve_activation(world.epoch.epoch_id)
    with pytest.raises(BarrierSetRefused):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert all_or_nothing(world) == "offline"
    assert decisions.decision_read("att-1").state == DecisionState.ROLLBACK_OPEN


class _StoppedAt(Exception):
    """The coordinator stopped at a named fault point (an in-process stand-in for a crash there, so the test can
    act before resuming)."""


def run_until(monkeypatch, point: str) -> None:
    """Run first_activation_commit of `att-1` until the fault point `point`, where it raises `_StoppedAt` (inside
    the activation transaction, which then rolls back; or after it, once committed)."""
    def stop(name):
        if name == point:
            raise _StoppedAt(name)

    monkeypatch.setattr(fa, "fault_point", stop)
    with pytest.raises(_StoppedAt):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    monkeypatch.undo()


def stop_after_commit(monkeypatch) -> None:
    """Run first_activation_commit of `att-1` until just after its activation COMMIT."""
    run_until(monkeypatch, "activation.after_commit")


@TX
def test_after_activating_v2_only_an_exact_readback_completes_and_releases(monkeypatch):
    """Once the decision is `activating_v2` and the activation committed, recovery goes on only forward: a resume
    whose readback does not see the exact epoch on every frozen gate (one gate's epoch digest damaged) refuses
    and leaves the set `activation_committed` (not released) and the decision `activating_v2`; with the gate
    exact again the same resume reads back, commits `v2_committed` and only then releases. Proves: CV2-11-040"""
    from tests import dbroles

    world = held_world()
    approve_activation(world.epoch.epoch_id)
    stop_after_commit(monkeypatch)
    attempt = ServiceCutoverAttempt.objects.get(attempt_key="att-1")
    assert fa.barrier_set_of(attempt).state == BarrierSetState.ACTIVATION_COMMITTED
    assert decisions.decision_read("att-1").state == DecisionState.ACTIVATING_V2
    from connector.models import AccountServingGate
    gate = AccountServingGate.objects.filter(account__in=world.accounts).order_by("pk").first()
    good = bytes(gate.epoch_digest)

    def set_digest(value: bytes) -> None:
        with connections["default"].cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("SET session_replication_role = replica")
            cursor.execute("UPDATE connector_accountservinggate SET epoch_digest = %s WHERE id = %s",
                           [value, gate.pk])
            cursor.execute("SET session_replication_role = origin")
            dbroles.admin_off(cursor)

    set_digest(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(CutoverPhaseRefused, match="readback"):
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert fa.barrier_set_of(attempt).state == BarrierSetState.ACTIVATION_COMMITTED
    assert decisions.decision_read("att-1").state == DecisionState.ACTIVATING_V2
    set_digest(good)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert all_or_nothing(world) == "serving"
    assert decisions.decision_read("att-1").state == DecisionState.V2_COMMITTED
    assert fa.barrier_set_of(attempt).state == BarrierSetState.RELEASED


@TX
@pytest.mark.parametrize("stale", ["gate_rows", "evidence"])
def test_evidence_read_before_the_locks_is_used_only_when_the_locked_rows_equal_it(monkeypatch, stale):
    """D-287: the coordinator computes the evidence before its locks and uses it under them only when every input
    equals what the locks hold. A pre-read gate set that differs from the locked gates (a gate row read stale) is
    not used: the evidence is recomputed from the locked rows, which match the held set, and the activation
    commits. A pre-computed evidence digest that differs while its inputs are equal would be used (that is the
    shortcut), so tampering it shows the comparison is real: the activation is refused as drift and nothing
    moves. Proves: CV2-12-064, CV2-12-067"""
    world = held_world()
    approve_activation(world.epoch.epoch_id)
    real_rows, real_evidence = fa._account_gates, fa.activation_evidence
    calls = []
    if stale == "gate_rows":
        def stale_rows(rows):
            accounts, gates = real_rows(rows)
            return accounts, [(a, pk, "v1_drained") for a, pk, _ in gates]
        monkeypatch.setattr(fa, "_account_gates", stale_rows)
    else:
        def early_tampered(attempt, epoch, *, gates=None, **kwargs):
            calls.append(gates is None)
            digest = real_evidence(attempt, epoch, gates=gates, **kwargs)
            return bytes(32) if gates is None else digest
        monkeypatch.setattr(fa, "activation_evidence", early_tampered)
    if stale == "gate_rows":
        fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
        assert all_or_nothing(world) == "serving"
    else:
        with pytest.raises(CutoverPhaseRefused, match="drift"):
            fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
        assert calls == [True]  # the early digest was used under the locks, and it was compared
        assert all_or_nothing(world) == "offline"


@TX
def test_once_activation_won_an_urgent_revocation_waits_through_activation_and_readback(monkeypatch):
    """After `activating_v2` wins the CutoverDecision, an urgent credential revocation no longer aborts the
    activation: it is refused (retryable, nothing changes: the credential gate keeps its mode and fence) while the
    set is still held with the decision won (the local transaction not yet committed), again once the activation
    committed but is not read back, and it applies only after the readback, `v2_committed` and the release; the
    activation itself completes untouched. Proves: CV2-11-041"""
    from connector.models import CredentialGenerationDispatchGate

    world = held_world()
    approve_activation(world.epoch.epoch_id)
    generation_id = world.configuration.credential_mappings.first().credential_generation.generation_id

    def credential_gate():
        gate = CredentialGenerationDispatchGate.objects.get(credential_generation__generation_id=generation_id)
        return gate.mode, gate.fence

    def revoke():
        return gate_services.credential_gate_transition(generation_id=generation_id, action="revoke",
                                                        expected_fence=None, actor=ACTOR, reason="key leaked")

    before = credential_gate()
    attempt = ServiceCutoverAttempt.objects.get(attempt_key="att-1")
    run_until(monkeypatch, "activation.after_decision")  # decision won in the journal, local transaction gone
    assert decisions.decision_read("att-1").state == DecisionState.ACTIVATING_V2
    assert fa.barrier_set_of(attempt).state == BarrierSetState.HELD
    with pytest.raises(PublicationBarrierHeld):
        revoke()
    assert credential_gate() == before and fa.barrier_set_of(attempt).state == BarrierSetState.HELD

    run_until(monkeypatch, "activation.after_commit")  # activation committed, not read back
    assert fa.barrier_set_of(attempt).state == BarrierSetState.ACTIVATION_COMMITTED
    with pytest.raises(PublicationBarrierHeld):
        revoke()
    assert credential_gate() == before

    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)  # readback, v2_committed, release
    assert all_or_nothing(world) == "serving"
    assert decisions.decision_read("att-1").state == DecisionState.V2_COMMITTED
    assert fa.barrier_set_of(attempt).state == BarrierSetState.RELEASED
    revoke()
    mode, fence = credential_gate()
    assert mode != before[0] and fence == before[1] + 1


@TX
def test_after_v2_committed_every_v1_table_is_terminal_read_only():
    """Once the first activation is read back and `v2_committed`, V1 is retired in one step: every V1 operational
    table refuses inserts, updates and deletes (constraint `cutover_v1_retired`, by trigger, whatever path writes):
    no new V1 generation, no barrier reopened, no work accepted, no row touched; the rows stay readable as
    evidence. Before that commit V1 wrote freely (the world accepted work and drained). Proves: CV2-12-069,
    CV2-12-077"""
    from django.db import IntegrityError, transaction

    from tests import dbroles
    from v1 import runtime
    from v1.models import V1Barrier, V1HighWater, V1OutboundEffect, V1ProcessGeneration, V1SourceCursor, V1WorkItem

    world = held_world()
    approve_activation(world.epoch.epoch_id)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    assert ServiceCutoverAttempt.objects.get(attempt_key="att-1").outcome == AttemptOutcome.V2_COMMITTED
    counts = {m: m.objects.count() for m in (V1ProcessGeneration, V1Barrier, V1SourceCursor, V1WorkItem,
                                             V1OutboundEffect, V1HighWater)}
    assert counts[V1WorkItem] and counts[V1Barrier]  # evidence kept and readable

    def refused(write) -> None:
        with pytest.raises(IntegrityError) as info, transaction.atomic():
            write()
        assert info.value.__cause__.diag.constraint_name == "cutover_v1_retired"

    refused(lambda: runtime.generation_start(started_by="late"))
    refused(lambda: V1WorkItem.objects.update(lease_generation="late"))  # past V1's own barrier checks
    refused(lambda: V1OutboundEffect.objects.update(state="abandoned"))
    refused(lambda: V1Barrier.objects.update(closed=False))
    refused(lambda: V1SourceCursor.objects.create(source_key="late"))
    with dbroles.as_admin():  # the application role may not delete V1 rows at all; the administrator is refused too
        refused(lambda: connections["default"].cursor().execute("DELETE FROM v1_v1workitem"))
        refused(lambda: connections["default"].cursor().execute("TRUNCATE v1_v1highwater CASCADE"))
    assert {m: m.objects.count() for m in counts} == counts
