"""Recovery of a crashed first-activation coordinator by one holder-fenced takeover of the same barrier set, and
the set's per-owner fenced receipts: a real coordinator process SIGKILLed at every barrier boundary, the
CutoverDecision followed by the recovering coordinator, the stale coordinator refused, no release by elapsed time,
one receipt per owner and one nonreleased set per activation scope under PostgreSQL's own constraints."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, ProgrammingError, connections, transaction

from connector.choices import EpochState, GateMode
from connector.errors import FenceStale
from connector.models import AuditRecord, ServingEpoch
from connector.services import owners
from cutover.choices import BarrierOwnerKind, BarrierSetState, DecisionState
from cutover.errors import BarrierSetRefused, CutoverPhaseRefused, PublicationBarrierHeld
from cutover.models import BarrierOwnerReceipt, CutoverDecision, ServiceCutoverAttempt, ServingPublicationBarrierSet
from cutover.services import decision as decisions
from cutover.services import first_activation as fa
from cutover.services import first_activation_recovery as recovery
from cutover.services.fencing import barrier_set_takeover
from tests.concurrency import run_concurrently
from tests.cutover.v1_world import ACTOR, approve_activation, build_v1_world, to_validating

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)
KEY = "att-1"
A, B = "coordinator-a", "coordinator-b"
# Every barrier boundary of the coordinator, with the decision the crash leaves and what recovery must reach.
BOUNDARIES = {
    "activation.after_acquire": (DecisionState.ROLLBACK_OPEN, BarrierSetState.ACQUIRING, BarrierSetState.HELD),
    "activation.after_hold": (DecisionState.ROLLBACK_OPEN, BarrierSetState.HELD, BarrierSetState.HELD),
    "activation.after_decision": (DecisionState.ACTIVATING_V2, BarrierSetState.HELD, BarrierSetState.RELEASED),
    "activation.before_commit": (DecisionState.ACTIVATING_V2, BarrierSetState.HELD, BarrierSetState.RELEASED),
    "activation.after_commit": (DecisionState.ACTIVATING_V2, BarrierSetState.ACTIVATION_COMMITTED,
                                BarrierSetState.RELEASED),
    "activation.after_v2_committed": (DecisionState.V2_COMMITTED, BarrierSetState.ACTIVATION_COMMITTED,
                                      BarrierSetState.RELEASED),
}
COORDINATOR = """
    from connector.actors import Actor
    from cutover.services import first_activation as fa
    actor, holder = Actor.system("coordinator"), ARGS["holder"]
    fa.first_activation_acquire(attempt_key="att-1", actor=actor, holder=holder)
    fa.first_activation_hold(attempt_key="att-1", actor=actor, holder=holder)
    fa.first_activation_commit(attempt_key="att-1", actor=actor, holder=holder)
    emit(done=True)
"""


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def validating_world():
    world = build_v1_world()
    world.accept(0, "k1", 1)
    to_validating(world)
    return world


def held_by(holder: str):
    world = validating_world()
    fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=holder)
    assert fa.first_activation_hold(attempt_key=KEY, actor=ACTOR, holder=holder).state == BarrierSetState.HELD
    return world


def serving_state(world) -> str:
    """'serving' (epoch active, every gate v2_serving on it) or 'offline'; a mix fails."""
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    modes = world.modes()
    if epoch.state == EpochState.ACTIVE and modes == {GateMode.V2_SERVING}:
        return "serving"
    assert epoch.state == EpochState.VERIFIED and modes == {GateMode.V2_VALIDATING}, (epoch.state, modes)
    return "offline"


def the_set() -> ServingPublicationBarrierSet:
    rows = list(ServingPublicationBarrierSet.objects.filter(attempt_key=KEY))
    assert len(rows) == 1, rows  # recovery never acquires a second set
    return rows[0]


def takeovers(row) -> int:
    return AuditRecord.objects.filter(entity_type=ServingPublicationBarrierSet._meta.label, entity_id=str(row.pk),
                                      action="barrier_set_takeover").count()


def stale_coordinator_is_refused(row_before) -> None:
    """Every act of the taken-over holder fails and changes nothing."""
    attempts = [
        lambda: fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=A),
        lambda: recovery.first_activation_release(attempt_key=KEY, holder=A, expected_fence=row_before.fence - 1,
                                                  reason="stale coordinator", actor=ACTOR),
        lambda: recovery.first_activation_release(attempt_key=KEY, holder=None, expected_fence=row_before.fence - 1,
                                                  reason="stale fence", actor=ACTOR),
        lambda: fa.first_activation_hold(attempt_key=KEY, actor=ACTOR, holder=A),
        lambda: fa.first_activation_commit(attempt_key=KEY, actor=ACTOR, holder=A),
    ]
    for attempt in attempts:
        with pytest.raises((BarrierSetRefused, FenceStale)):
            attempt()
    after = the_set()
    assert (after.state, after.fence, after.holder) == (row_before.state, row_before.fence, row_before.holder)


@TX
@pytest.mark.parametrize("point", list(BOUNDARIES))
def test_a_coordinator_crash_at_every_barrier_boundary_recovers_by_one_fenced_takeover(point, run_child):
    """A coordinator process SIGKILLed at each barrier boundary (set acquired, set held, decision won, activation
    written, activation committed, v2_committed) is recovered by ONE holder-fenced takeover of the same set and
    CutoverDecision: the new holder loads the decision and the receipts and resumes acquisition while rollback is
    open, or resumes the activation once it won, reading back before it releases. The crashed holder's acquire,
    hold, activation and release are refused afterwards and change nothing; the recovery acquires no second set.
    Proves: CV2-11-043, CV2-11-056, CV2-11-049"""
    world = validating_world()
    approve_activation(world.epoch.epoch_id)
    child = run_child(COORDINATOR, point, holder=A)
    assert child.killed, child.stderr
    decision_state, set_state, recovered_state = BOUNDARIES[point]
    crashed = the_set()
    decision = decisions.decision_read(KEY)
    assert (crashed.holder, crashed.state, decision.state) == (A, set_state, decision_state)
    assert serving_state(world) == ("serving" if set_state == BarrierSetState.ACTIVATION_COMMITTED else "offline")

    taken = barrier_set_takeover(barrier_set_pk=crashed.pk, holder=B, actor=ACTOR)
    assert (taken.pk, taken.holder, taken.state, taken.fence) == (crashed.pk, B, crashed.state, crashed.fence + 1)
    stale_coordinator_is_refused(taken)

    result = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    row = the_set()
    assert (result.barrier_set_pk, result.holder, result.set_state) == (crashed.pk, B, recovered_state)
    assert takeovers(row) == 1  # the takeover is idempotent for its holder: one, not one per call
    assert CutoverDecision.objects.using("journal").filter(attempt_key=KEY).count() == 1
    assert CutoverDecision.objects.using("journal").get(attempt_key=KEY).pk == decision.pk
    if decision_state == DecisionState.ROLLBACK_OPEN:
        # rollback still open: recovery resumed acquisition only; the activation needs its own decision, taken by
        # the new holder alone
        assert serving_state(world) == "offline" and result.decision == DecisionState.ROLLBACK_OPEN
        with pytest.raises(FenceStale):  # the taken-over holder (D-133)
            fa.first_activation_commit(attempt_key=KEY, actor=ACTOR, holder=A)
        fa.first_activation_commit(attempt_key=KEY, actor=ACTOR, holder=B)
    assert serving_state(world) == "serving"
    assert decisions.decision_read(KEY).state == DecisionState.V2_COMMITTED
    assert the_set().state == BarrierSetState.RELEASED
    with pytest.raises(BarrierSetRefused):
        fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=A)


@TX
def test_activation_winning_recovery_reads_back_before_it_releases(monkeypatch):
    """After the local activation commit, recovery releases only after the exact readback: a readback that does not
    see the epoch on every gate refuses and leaves the set activation_committed under the new holder; the next
    recovery reads back and releases. Proves: CV2-11-043, CV2-11-056"""
    world = held_by(A)
    approve_activation(world.epoch.epoch_id)

    def stop(name):
        if name == "activation.after_commit":
            raise RuntimeError("crashed after the local commit")

    monkeypatch.setattr(fa, "fault_point", stop)
    with pytest.raises(RuntimeError):
        fa.first_activation_commit(attempt_key=KEY, actor=ACTOR, holder=A)
    monkeypatch.undo()
    monkeypatch.setattr(fa, "_readback", lambda attempt, epoch_pk: False)
    with pytest.raises(CutoverPhaseRefused, match="readback"):
        recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    row = the_set()
    assert (row.state, row.holder) == (BarrierSetState.ACTIVATION_COMMITTED, B)
    assert decisions.decision_read(KEY).state == DecisionState.ACTIVATING_V2
    with pytest.raises(BarrierSetRefused):  # activation won: no release before the readback
        recovery.first_activation_release(attempt_key=KEY, holder=B, expected_fence=row.fence, reason="give up",
                                          actor=ACTOR)
    monkeypatch.undo()
    result = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    assert (result.set_state, result.decision) == (BarrierSetState.RELEASED, DecisionState.V2_COMMITTED)
    assert serving_state(world) == "serving" and takeovers(the_set()) == 1


@TX
def test_recovery_releases_when_restore_won_and_may_release_while_rollback_is_open():
    """Restore won the CutoverDecision while the crashed coordinator held the set: recovery takes it over and
    releases it (the restore may proceed), activating nothing; the stale holder cannot release or reacquire. While
    rollback is open, recovery may instead release on request. Proves: CV2-11-043, CV2-11-056"""
    world = held_by(A)
    opened = decisions.decision_read(KEY)
    decisions.decision_choose_restore(KEY, expected_fence=opened.fence)
    held = the_set()
    result = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    assert (result.barrier_set_pk, result.set_state, result.decision) == (held.pk, BarrierSetState.RELEASED,
                                                                         DecisionState.RESTORING_V1)
    assert serving_state(world) == "offline"
    assert the_set().release_reason.startswith(f"recovery by {B}: restore won")
    with pytest.raises(BarrierSetRefused):
        recovery.first_activation_release(attempt_key=KEY, holder=A, expected_fence=held.fence, reason="stale",
                                          actor=ACTOR)
    with pytest.raises(BarrierSetRefused):
        fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=A)


@TX
def test_recovery_while_rollback_is_open_releases_only_on_request():
    """Proves: CV2-11-043"""
    world = held_by(A)
    kept = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    assert (kept.set_state, kept.holder, kept.decision) == (BarrierSetState.HELD, B, DecisionState.ROLLBACK_OPEN)
    released = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR, release=True,
                                                 reason="operator abandons the activation")
    assert released.set_state == BarrierSetState.RELEASED and serving_state(world) == "offline"
    assert decisions.decision_read(KEY).state == DecisionState.ROLLBACK_OPEN
    assert takeovers(the_set()) == 1


@TX
def test_elapsed_time_never_unlocks_a_held_set():
    """A set held for ten years is exactly as held: owner publications are still refused, recovery under an open
    rollback keeps it held (only its holder and fence move, by the takeover), and nothing but an explicit fenced
    release reopens publication. Proves: CV2-11-056"""
    from tests import dbroles

    world = held_by(A)
    row = the_set()
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE cutover_servingpublicationbarrierset SET created_at = created_at - interval '10 years',"
                       " changed_at = changed_at - interval '10 years' WHERE id = %s", [row.pk])
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)

    def publish():
        owners.credential_generation_create(
            generation_id="late.g1", credential_identity="crm-api", account_key=world.keys[0], secret=b"s" * 16,
            transport_config={"base_url": "http://127.0.0.1:1", "auth": "bearer"}, actor=ACTOR)

    with pytest.raises(PublicationBarrierHeld):
        publish()
    result = recovery.first_activation_recover(attempt_key=KEY, holder=B, actor=ACTOR)
    assert (result.set_state, result.fence) == (BarrierSetState.HELD, row.fence + 1)
    with pytest.raises(PublicationBarrierHeld):
        publish()
    recovery.first_activation_release(attempt_key=KEY, holder=B, expected_fence=result.fence, reason="explicit",
                                      actor=ACTOR)
    publish()


# -- per-owner fenced receipts and one nonreleased set per activation scope (CV2-15-009) --------------------------

def expected_owners(epoch) -> set[tuple[str, str]]:
    packs = set(epoch.binding_proofs.values_list("binding__owner_pack", flat=True))
    view = epoch.catalog_view
    return ({(BarrierOwnerKind.CATALOG, f"{view.view_key}@{view.revision}"),
             (BarrierOwnerKind.CONFIGURATION, epoch.configuration.generation_id),
             (BarrierOwnerKind.CREDENTIAL_AUTHORITY, "credential_authority")}
            | {(BarrierOwnerKind.BINDING_DEFINITION, pack) for pack in packs})


@TX
def test_a_set_holds_exactly_one_fenced_receipt_per_owner():
    """Acquiring writes one receipt for the Catalog, each binding-definition owner, the L2 configuration owner and
    credential authority, under the holder and fence that acquired; PostgreSQL refuses a second receipt of an owner
    (and a second Catalog/configuration/credential-authority receipt under another ID) and any change of one; a
    receipt naming an owner the candidate does not have makes the hold release the set instead of holding it.
    Proves: CV2-15-009"""
    from tests import dbroles

    world = validating_world()
    row = fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=A)
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    receipts = list(BarrierOwnerReceipt.objects.filter(barrier_set=row))
    owners_seen = [(r.owner_kind, r.owner_id) for r in receipts]
    assert len(owners_seen) == len(set(owners_seen)) and set(owners_seen) == expected_owners(epoch)
    assert {BarrierOwnerKind.BINDING_DEFINITION} <= {r.owner_kind for r in receipts}
    assert {(r.holder, r.fence) for r in receipts} == {(A, row.fence)}
    catalog = next(r for r in receipts if r.owner_kind == BarrierOwnerKind.CATALOG)
    for kind, owner_id, name in [(catalog.owner_kind, catalog.owner_id, "cutover_barrierreceipt_one_per_owner"),
                                 (BarrierOwnerKind.CATALOG, "another-view@1", "one_singleton_owner"),
                                 (BarrierOwnerKind.CREDENTIAL_AUTHORITY, "other", "one_singleton_owner")]:
        with pytest.raises(IntegrityError, match=name), transaction.atomic():
            BarrierOwnerReceipt.objects.create(barrier_set=row, owner_kind=kind, owner_id=owner_id,
                                               receipt_digest=b"\x01" * 32, holder=A, fence=row.fence)
    with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic():  # the app role
        BarrierOwnerReceipt.objects.filter(pk=catalog.pk).update(receipt_digest=b"\x02" * 32)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():  # the trigger, for the owner
        with connections["default"].cursor() as cursor:
            dbroles.admin_on(cursor)
            cursor.execute("UPDATE cutover_barrierownerreceipt SET receipt_digest = %s WHERE id = %s",
                           [b"\x02" * 32, catalog.pk])
    BarrierOwnerReceipt.objects.create(barrier_set=row, owner_kind=BarrierOwnerKind.BINDING_DEFINITION,
                                       owner_id="pack-nobody-binds", receipt_digest=b"\x03" * 32, holder=A,
                                       fence=row.fence)
    refused = fa.first_activation_hold(attempt_key=KEY, actor=ACTOR, holder=A)
    assert refused.state == BarrierSetState.RELEASED and "pack-nobody-binds" in refused.release_reason
    assert serving_state(world) == "offline"


@TX
def test_a_second_nonreleased_set_per_activation_scope_is_refused_by_postgresql(monkeypatch):
    """Two coordinators acquiring concurrently (real threads, own connections), both past the application's check
    (it is bypassed here): PostgreSQL's partial unique index lets exactly one set open, the other acquisition is
    refused (BARRIER_SET_REFUSED) and leaves no set and no receipt; a direct second insert is refused by name.
    Proves: CV2-15-009"""
    world = validating_world()
    monkeypatch.setattr(fa, "barrier_set_of", lambda attempt: None)
    results = run_concurrently(
        [lambda: fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=A),
         lambda: fa.first_activation_acquire(attempt_key=KEY, actor=ACTOR, holder=B)],
        expect=BarrierSetRefused, before=lambda: connections["default"].ensure_connection())
    monkeypatch.undo()
    won = [r for r in results if isinstance(r, ServingPublicationBarrierSet)]
    assert len(won) == 1 and sum(isinstance(r, BarrierSetRefused) for r in results) == 1, results
    row = the_set()
    assert row.pk == won[0].pk
    assert set(BarrierOwnerReceipt.objects.values_list("barrier_set_id", flat=True)) == {row.pk}
    epoch = ServingEpoch.objects.get(pk=world.epoch.pk)
    with pytest.raises(IntegrityError, match="cutover_barrierset_one_open_first_activation"), transaction.atomic():
        ServingPublicationBarrierSet.objects.create(
            successor_epoch=epoch, successor_key=epoch.epoch_id, successor_digest=bytes(epoch.digest),
            scope_digest=bytes(epoch.serving_scope_digest), holder="third", attempt_key=KEY)
    assert ServiceCutoverAttempt.objects.get(attempt_key=KEY).outcome == "open"


@TX
def test_postgresql_allows_a_takeover_only_as_one_fence_step_on_an_open_set():
    """The set's row itself refuses a holder change that does not advance the fence by exactly one, one that also
    moves the state, and any takeover of a released set: a stale coordinator cannot take a set back around the
    service either. Proves: CV2-11-056"""
    held_by(A)
    row = the_set()
    rows = ServingPublicationBarrierSet.objects.filter(pk=row.pk)
    for change, name in [({"holder": B}, "fence_advance"), ({"holder": B, "fence": row.fence + 2}, "fence_advance"),
                         ({"holder": B, "fence": row.fence + 1, "state": BarrierSetState.RELEASED}, "takeover")]:
        with pytest.raises(IntegrityError) as refused, transaction.atomic():
            rows.update(**change)
        assert refused.value.__cause__.diag.constraint_name == f"cutover_servingpublicationbarrierset_{name}"
    assert rows.update(holder=B, fence=row.fence + 1) == 1  # the one legal form: what take_over writes
    recovery.first_activation_release(attempt_key=KEY, holder=B, expected_fence=row.fence + 1, reason="done",
                                      actor=ACTOR)
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        rows.update(holder=A, fence=row.fence + 3)
    assert refused.value.__cause__.diag.constraint_name == "cutover_servingpublicationbarrierset_takeover"
    assert (the_set().holder, the_set().state) == (B, BarrierSetState.RELEASED)


@TX
def test_the_operator_recovers_from_the_command_line():
    """`manage.py cutover recover` takes the set over as this coordinator and follows the decision; with
    `--release` (rollback still open) it releases explicitly. Proves: CV2-11-043"""
    from django.core.management import call_command

    held_by(A)
    call_command("cutover", "--coordinator", "ops-2", "recover", "--attempt", KEY)
    row = the_set()
    assert (row.holder, row.state) == ("system:cutover:ops-2", BarrierSetState.HELD)
    call_command("cutover", "--coordinator", "ops-2", "recover", "--attempt", KEY, "--release", "--reason", "abandon")
    row = the_set()
    assert row.state == BarrierSetState.RELEASED and row.release_reason == "recovery by system:cutover:ops-2: abandon"
    assert takeovers(row) == 1
