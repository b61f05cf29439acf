"""The contract's `failure_scenarios`, each reproduced end to end: a plan admitted through the planning service, the
child stepped by the runner, the request sent through the sole egress adapter (effects.egress) over real HTTP to a
loopback DeliveryReceiver, the answer read by the receiver protocol, verified and finalised. Every scenario test
proves, from the durable record:
- the operation passed through the scenario's `from` tuple into its `to` tuple (audit trail + legal transition);
- the acknowledgement axis is the scenario's `acknowledgement_preserved`;
- `last_code` is the contract error code that fits (a catalogued, stable code);
- the receiver applied each receiver mutation key at most once;
- remote job capacity is retained for unknown/partial outcomes and released otherwise.
One named test per scenario (no parametrisation), and a completeness test ties the names to the contract."""
from __future__ import annotations

import re
import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from connector.actors import Actor
from connector.models import AuditRecord
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryPermissionDenied, DeliveryRequestInvalid
from tests.effects.delivery.receiver import DeliveryReceiver
from effects.models import (
    DeliveryAttempt,
    DeliveryObservation,
    DeliveryOperation,
    DeliveryReconciliation,
    MayAttemptMarker,
)
from effects.choices import CapacityState
from effects.services.delivery import execution, runner
from effects.services.delivery.reconciliation import reconcile_open, reconcile_resolve
from tests.effects.delivery.world import NAMESPACE, T0, build, operator

TWO_RECORDS = [{"at": (T0 + timedelta(hours=h)).isoformat(), "id": f"r{h}", "v": h} for h in range(2)]


# -- helpers ------------------------------------------------------------------------------------------------------

@pytest.fixture
def aworld(async_receiver):
    """A world whose binding points at the async_bulk_job receiver (profiles suffixed "-a")."""
    return build(async_receiver.url, kind_suffix="-a")


def single_child(world, profile=None, **kw) -> DeliveryOperation:
    """Plan and admit a parent of two records: exactly one child (max_records_per_child=2)."""
    parent = world.plan(profile=profile or world.sync, records=TWO_RECORDS, **kw)
    children = list(parent.children.order_by("ordinal"))
    assert len(children) == 1
    return children[0]


def run_to_final(op_pk: int, *, max_steps: int = 20) -> DeliveryOperation:
    for _ in range(max_steps):
        state = runner.step(op_pk)
        if state.startswith("final_") or state == "retry_wait":
            break
    return DeliveryOperation.objects.get(pk=op_pk)


def transitions(op: DeliveryOperation) -> list[tuple[str, str]]:
    return list(AuditRecord.objects.filter(
        entity_type="effects.DeliveryOperation", entity_id=str(op.pk), action="delivery_transition",
    ).order_by("pk").values_list("from_state", "to_state"))


def assert_applied_at_most_once(receiver: DeliveryReceiver, op: DeliveryOperation) -> None:
    key = bytes(op.receiver_mutation_key).hex()
    assert set(receiver.applied) <= {key}, receiver.applied
    assert all(n <= 1 for n in receiver.applied.values()), receiver.applied
    # every mutation request carried the operation's receiver mutation key as its idempotency key
    assert {r["key"] for r in receiver.mutations()} <= {key}


def assert_scenario(name: str, op: DeliveryOperation, receiver: DeliveryReceiver, *, code: str,
                    capacity_reserved: bool) -> None:
    scenario = contract().failure_scenarios[name]
    op.refresh_from_db()
    path = transitions(op)
    assert (scenario.source, scenario.target) in path, path
    rule = contract().transition(scenario.source, scenario.target)
    assert rule is not None and not rule.operator_only
    assert op.state == scenario.target, (op.state, path)
    assert op.axis("acknowledgement") == scenario.acknowledgement_preserved
    # the generated column agrees with the in-memory axis
    assert DeliveryOperation.objects.filter(pk=op.pk).values_list("acknowledgement", flat=True).get() == \
        scenario.acknowledgement_preserved
    assert op.last_code == code, (op.last_code, op.last_detail)
    if code:
        assert code in contract().errors
    assert_applied_at_most_once(receiver, op)
    capacity = list(op.attempts.order_by("ordinal").values_list("capacity_state", flat=True))
    assert capacity, "at least one attempt was made"
    if capacity_reserved:
        assert capacity[-1] == CapacityState.RESERVED, capacity
        assert all(c != CapacityState.RESERVED for c in capacity[:-1]), capacity
    else:
        assert CapacityState.RESERVED not in capacity, capacity


# -- the ten scenarios ------------------------------------------------------------------------------------------

def test_request_not_started_retry(world, sync_receiver):
    """A 429 with Retry-After inside the budget proves the request did not start: submitting -> retry_wait (ack
    NOT_ACCEPTED, capacity released), then a second attempt after the due time with the SAME delivery key and
    receiver mutation key, attempt_ordinal 2 and a new MAY_ATTEMPT marker, succeeds.
    Proves: failure_scenarios.request_not_started_retry, request_not_started_can_retry_with_same_delivery_key,
    may_attempt_marker_is_attempt_scoped, immutable_pre_attempt_marker_precedes_submitting."""
    sync_receiver.queue("rate_limit", "full")
    op = single_child(world)
    delivery_key = bytes(op.delivery_key)
    assert run_to_final(op.pk).state == "retry_wait"
    assert_scenario("request_not_started_retry", op, sync_receiver, code="", capacity_reserved=False)
    assert op.attempt_ordinal == 1 and op.next_attempt_after > timezone.now() - timedelta(seconds=1)
    assert sync_receiver.applied == {}

    # not due yet: no second request
    assert execution.submit(op.pk).waiting_for == "retry_due"
    assert len(sync_receiver.mutations()) == 1
    time.sleep(max(0.0, (op.next_attempt_after - timezone.now()).total_seconds()) + 0.05)

    op = run_to_final(op.pk)
    assert op.state == "final_full_promoted", transitions(op)
    assert ("retry_wait", "submitting") in transitions(op)
    assert op.attempt_ordinal == 2
    assert bytes(op.delivery_key) == delivery_key
    mutations = sync_receiver.mutations()
    assert [m["mode"] for m in mutations] == ["rate_limit", "full"]
    assert mutations[0]["key"] == mutations[1]["key"] == bytes(op.receiver_mutation_key).hex()
    assert sync_receiver.applied == {bytes(op.receiver_mutation_key).hex(): 1}

    markers = list(MayAttemptMarker.objects.filter(operation=op).order_by("attempt_ordinal"))
    attempts = list(DeliveryAttempt.objects.filter(operation=op).order_by("ordinal"))
    assert [m.attempt_ordinal for m in markers] == [1, 2]
    assert len({m.attempt_id for m in markers}) == 2
    assert [a.marker_id for a in attempts] == [m.pk for m in markers]
    assert [a.attempt_id for a in attempts] == [m.attempt_id for m in markers]
    assert all(m.created_at <= a.created_at for m, a in zip(markers, attempts, strict=True))
    assert [a.outcome for a in attempts] == ["not_started", "answered"]
    assert [a.capacity_released_reason for a in attempts] == ["durable_retry_wait", "terminal_observation"]
    assert all(a.capacity_state == CapacityState.RELEASED for a in attempts)


def test_request_not_started_no_retry():
    """A 429 whose Retry-After (60 s) exceeds the profile's budget (5 s): the request did not start and no
    automatic retry is allowed: submitting -> final_not_started, REST_DELIVERY_RETRY_AFTER_EXCEEDS_BUDGET,
    capacity released, nothing applied, no second request.
    Proves: failure_scenarios.request_not_started_no_retry."""
    receiver = DeliveryReceiver(kind="sync_batch", default="rate_limit", retry_after=60).start()
    try:
        world = build(receiver.url)
        op = single_child(world)
        op = run_to_final(op.pk)
        assert_scenario("request_not_started_no_retry", op, receiver,
                        code="REST_DELIVERY_RETRY_AFTER_EXCEEDS_BUDGET", capacity_reserved=False)
        assert op.axis("remote_effect") == "NONE_PROVEN"
        assert receiver.applied == {}
        assert len(receiver.mutations()) == 1
        assert runner.step(op.pk) == "final_not_started"  # terminal: stepping again sends nothing
        assert len(receiver.mutations()) == 1
    finally:
        receiver.stop()


def test_request_not_started_no_retry_connection_refused_exhausts_attempts():
    """A receiver that refuses connections proves each attempt never started; after max_attempts (3) the
    operation is final_not_started with every attempt's capacity released and the same delivery key throughout.
    Proves: failure_scenarios.request_not_started_no_retry (attempts exhausted),
    request_not_started_can_retry_with_same_delivery_key."""
    receiver = DeliveryReceiver(kind="sync_batch").start()
    world = build(receiver.url)
    op = single_child(world)
    receiver.stop()  # connection refused from here on
    for _ in range(3):
        op = run_to_final(op.pk)
        if op.state != "retry_wait":
            break
    assert_scenario("request_not_started_no_retry", op, receiver, code="REST_DELIVERY_UNSAFE_RETRY",
                    capacity_reserved=False)
    attempts = list(op.attempts.order_by("ordinal"))
    assert [a.ordinal for a in attempts] == [1, 2, 3]
    assert all(a.outcome == "not_started" and a.io_may_have_started for a in attempts)
    assert MayAttemptMarker.objects.filter(operation=op).count() == 3
    assert transitions(op).count(("submitting", "retry_wait")) == 2


def test_success_count_mismatch_partial(world, sync_receiver):
    """The receiver answers `succeeded` but applied 1 of 2 records: verifying_success -> final_partial_success_ack
    with REST_DELIVERY_COUNT_MISMATCH; the SUCCEEDED acknowledgement is kept; capacity stays reserved.
    Proves: failure_scenarios.success_count_mismatch_partial,
    successful_acknowledgement_preserved_on_partial_or_unknown_effect."""
    sync_receiver.queue("partial")
    op = run_to_final(single_child(world).pk)
    assert_scenario("success_count_mismatch_partial", op, sync_receiver, code="REST_DELIVERY_COUNT_MISMATCH",
                    capacity_reserved=True)
    assert op.applied_count == 1 and op.record_count == 2
    assert op.axis("checkpoint") == "BLOCKED"


def test_success_count_missing_unknown(world, sync_receiver):
    """The receiver answers `succeeded` without an applied count: verifying_success -> final_unknown_success_ack
    with REST_DELIVERY_REMOTE_EFFECT_UNKNOWN; capacity stays reserved until reconciliation.
    Proves: failure_scenarios.success_count_missing_unknown,
    successful_acknowledgement_preserved_on_partial_or_unknown_effect,
    unknown_remote_job_retains_capacity_until_reconciliation."""
    sync_receiver.queue("count_missing")
    op = run_to_final(single_child(world).pk)
    assert_scenario("success_count_missing_unknown", op, sync_receiver,
                    code="REST_DELIVERY_REMOTE_EFFECT_UNKNOWN", capacity_reserved=True)
    assert op.axis("verification") == "NOT_PROVABLE"


def test_failed_atomic_rollback_proven(world, sync_receiver):
    """The receiver answers `failed` with applied 0 and rolled_back: verifying_failure -> final_no_effect_failed_ack
    (no effect proven, no error code), capacity released, nothing applied.
    Proves: failure_scenarios.failed_atomic_rollback_proven."""
    sync_receiver.queue("fail_rollback")
    op = run_to_final(single_child(world).pk)
    assert_scenario("failed_atomic_rollback_proven", op, sync_receiver, code="", capacity_reserved=False)
    assert op.axis("remote_effect") == "NONE_PROVEN"
    assert sync_receiver.applied == {}


def test_failed_partial_effect(world, sync_receiver):
    """The receiver answers `failed` but applied 1 of 2 without rollback: verifying_failure ->
    final_partial_failed_ack with REST_DELIVERY_PARTIALLY_APPLIED; capacity stays reserved.
    Proves: failure_scenarios.failed_partial_effect."""
    sync_receiver.queue("fail_partial")
    op = run_to_final(single_child(world).pk)
    assert_scenario("failed_partial_effect", op, sync_receiver, code="REST_DELIVERY_PARTIALLY_APPLIED",
                    capacity_reserved=True)
    assert op.applied_count == 1


def test_failed_effect_unknown(world, sync_receiver):
    """The receiver answers `failed` with no count and no rollback: verifying_failure -> final_unknown_failed_ack
    with REST_DELIVERY_REMOTE_EFFECT_UNKNOWN; capacity stays reserved.
    Proves: failure_scenarios.failed_effect_unknown, unknown_remote_job_retains_capacity_until_reconciliation."""
    sync_receiver.queue("fail_unknown")
    op = run_to_final(single_child(world).pk)
    assert_scenario("failed_effect_unknown", op, sync_receiver, code="REST_DELIVERY_REMOTE_EFFECT_UNKNOWN",
                    capacity_reserved=True)


def test_cancelled_effect_unknown(aworld, async_receiver):
    """An async job accepted (202) and then reported `cancelled` with no count: accepted -> verifying_cancelled ->
    final_unknown_cancelled_ack with REST_DELIVERY_REMOTE_EFFECT_UNKNOWN; capacity stays reserved.
    Proves: failure_scenarios.cancelled_effect_unknown, unknown_remote_job_retains_capacity_until_reconciliation."""
    async_receiver.queue("job_cancelled_unknown")
    op = run_to_final(single_child(aworld, aworld.asyncp).pk)
    assert_scenario("cancelled_effect_unknown", op, async_receiver, code="REST_DELIVERY_REMOTE_EFFECT_UNKNOWN",
                    capacity_reserved=True)
    assert ("submitting", "accepted") in transitions(op)
    assert op.remote_receipt_id


def test_expired_effect_unknown(aworld, async_receiver):
    """An async job whose receipt expires (410) before a terminal status: verifying_expired ->
    final_unknown_expired_ack with REST_DELIVERY_RECEIPT_EXPIRED; EXPIRED is preserved; capacity stays reserved.
    Proves: failure_scenarios.expired_effect_unknown, expired_acknowledgement_preserved_on_unknown_effect,
    unknown_remote_job_retains_capacity_until_reconciliation."""
    async_receiver.queue("job_expire")
    op = run_to_final(single_child(aworld, aworld.asyncp).pk)
    assert_scenario("expired_effect_unknown", op, async_receiver, code="REST_DELIVERY_RECEIPT_EXPIRED",
                    capacity_reserved=True)
    assert ("accepted", "verifying_expired") in transitions(op)
    assert DeliveryObservation.objects.filter(operation=op, kind="poll", http_status=410,
                                              acknowledgement="EXPIRED").exists()


def test_protocol_unknown_after_running(aworld, async_receiver):
    """An async job reported `running`, then an unparsable receipt answer: accepted -> waiting ->
    final_unknown_protocol_ack with REST_DELIVERY_PROTOCOL_UNKNOWN; capacity stays reserved.
    Proves: failure_scenarios.protocol_unknown_after_running."""
    async_receiver.queue("job_running_then_protocol")
    op = run_to_final(single_child(aworld, aworld.asyncp).pk)
    assert_scenario("protocol_unknown_after_running", op, async_receiver, code="REST_DELIVERY_PROTOCOL_UNKNOWN",
                    capacity_reserved=True)
    assert ("accepted", "waiting") in transitions(op)
    polls = list(DeliveryObservation.objects.filter(operation=op, kind="poll").order_by("ordinal")
                 .values_list("acknowledgement", flat=True))
    assert polls == ["RUNNING", "PROTOCOL_UNKNOWN"]


def test_every_failure_scenario_has_a_named_end_to_end_test():
    """Proves: every_failure_scenario_maps_to_a_legal_transition (each scenario is an automatic transition of the
    contract that keeps its acknowledgement), and that the set of scenario tests here (`test_<name>` whose
    docstring says "Proves: failure_scenarios.<name>") equals the contract's scenarios, so a missing scenario fails."""
    c = contract()
    module = sys.modules[__name__]
    tests = {name: getattr(module, name) for name in dir(module) if name.startswith("test_")}
    claimed = {m for fn in tests.values() for m in re.findall(r"failure_scenarios\.(\w+)", fn.__doc__ or "")}
    named = {name[len("test_"):] for name, fn in tests.items()
             if f"failure_scenarios.{name[len('test_'):]}" in (fn.__doc__ or "")}
    assert named == set(c.failure_scenarios), named ^ set(c.failure_scenarios)
    assert claimed == set(c.failure_scenarios), claimed ^ set(c.failure_scenarios)
    assert len(c.failure_scenarios) == 10
    for scenario in c.failure_scenarios.values():
        rule = c.transition(scenario.source, scenario.target)
        assert rule is not None and not rule.operator_only, scenario
        assert c.axis(scenario.target, "acknowledgement") == scenario.acknowledgement_preserved


# -- reconciliation end to end ------------------------------------------------------------------------------------

def unknown_success(world, receiver) -> DeliveryOperation:
    """A real unknown outcome: the receiver applied the batch but answered without a count."""
    receiver.queue("count_missing")
    op = run_to_final(single_child(world).pk)
    assert op.state == "final_unknown_success_ack"
    assert op.attempts.get().capacity_state == CapacityState.RESERVED
    return op


def reconcile_rows(op: DeliveryOperation) -> list[tuple[str, str]]:
    return list(DeliveryReconciliation.objects.filter(operation=op).order_by("pk")
                .values_list("from_state", "to_state"))


RESOLUTIONS = {
    # effect -> (target tuple, proof, final state after the resolution commits, capacity after)
    "none": ("final_no_effect_success_ack", {"applied_count": 0, "source": "receiver-query:none"},
             "final_no_effect_success_ack", CapacityState.RELEASED),
    "full": ("final_full_eligible", {"applied_count": 2, "source": "receiver-query:all"},
             "final_full_promoted", CapacityState.RELEASED),
    "partial": ("final_partial_success_ack", {"applied_count": 1, "source": "receiver-query:half"},
                "final_partial_success_ack", CapacityState.RELEASED),
    "unknown": ("final_unknown_success_ack", {"evidence_digest": "ab" * 32},
                "final_unknown_success_ack", CapacityState.RESERVED),
}


@pytest.mark.parametrize("effect", sorted(RESOLUTIONS))
def test_every_unknown_reconciliation_can_resolve_none_full_partial_or_remain_unknown(world, sync_receiver, effect):
    """An unknown outcome (count missing) opened by an operator with `effects.reconcile_delivery` and resolved with
    proof to none / full / partial, or kept unknown with an evidence digest. The SUCCEEDED acknowledgement never
    changes; capacity is released when the effect is resolved and kept while it stays unknown.
    Proves: every_unknown_reconciliation_can_resolve_none_full_partial_or_remain_unknown,
    reconciliation_preserves_acknowledgement_while_resolving_effect,
    unknown_remote_job_retains_capacity_until_reconciliation."""
    target, proof, final, capacity = RESOLUTIONS[effect]
    op = unknown_success(world, sync_receiver)
    actor = Actor.for_user(world.admin)

    op = reconcile_open(actor=actor, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-1", note="inspect receiver")
    op.refresh_from_db()
    assert op.state == "reconciling_unknown_success_ack"
    assert op.axis("acknowledgement") == "SUCCEEDED"
    assert op.attempts.get().capacity_state == CapacityState.RESERVED  # opening resolves nothing

    approver = Actor.for_user(world.approver)
    op = reconcile_resolve(actor=approver, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-1", target=target,
                           proof=proof, note=f"resolved {effect}")
    op.refresh_from_db()
    assert op.state == final, op.state
    assert op.axis("acknowledgement") == "SUCCEEDED"
    assert op.axis("remote_effect") == contract().axis(target, "remote_effect")
    assert op.reconciled is (effect != "unknown")
    attempt = op.attempts.get()
    assert attempt.capacity_state == capacity
    if capacity == CapacityState.RELEASED:
        assert attempt.capacity_released_reason == "reconciliation"
    assert reconcile_rows(op) == [("final_unknown_success_ack", "reconciling_unknown_success_ack"),
                                  ("reconciling_unknown_success_ack", target)]
    rows = list(DeliveryReconciliation.objects.filter(operation=op).order_by("pk"))
    assert [r.approved_by_id for r in rows] == [world.admin.pk, world.approver.pk]
    assert rows[1].proof == proof and rows[1].proof_kind == contract().transition(
        "reconciling_unknown_success_ack", target).proof
    assert AuditRecord.objects.filter(entity_type="effects.DeliveryOperation", entity_id=str(op.pk),
                                      action="delivery_reconcile").count() == 2
    if effect == "unknown":  # still unknown: it can be reopened later
        assert contract().transition(op.state, "reconciling_unknown_success_ack") is not None
    assert_applied_at_most_once(sync_receiver, op)


def test_reconciling_expired_unknown_keeps_expired_acknowledgement(aworld, async_receiver):
    """An async receipt that expired with the effect unknown, reconciled to no effect: EXPIRED is preserved and
    capacity is released by the resolution.
    Proves: expired_acknowledgement_preserved_on_unknown_effect,
    reconciliation_preserves_acknowledgement_while_resolving_effect,
    unknown_remote_job_retains_capacity_until_reconciliation."""
    async_receiver.queue("job_expire")
    op = run_to_final(single_child(aworld, aworld.asyncp).pk)
    assert op.state == "final_unknown_expired_ack"
    actor = Actor.for_user(aworld.admin)
    reconcile_open(actor=actor, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-exp")
    op.refresh_from_db()
    assert op.state == "reconciling_unknown_expired_ack" and op.axis("acknowledgement") == "EXPIRED"
    assert op.attempts.get().capacity_state == CapacityState.RESERVED
    reconcile_resolve(actor=actor, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-exp",
                      target="final_no_effect_expired_ack",
                      proof={"applied_count": 0, "source": "receiver-query:job"})
    op.refresh_from_db()
    assert op.state == "final_no_effect_expired_ack" and op.axis("acknowledgement") == "EXPIRED"
    assert op.attempts.get().capacity_state == CapacityState.RELEASED


def _snapshot(op: DeliveryOperation) -> tuple:
    op.refresh_from_db()
    return (op.state, op.revision, op.reconciliation_id, op.reconciled,
            tuple(op.attempts.values_list("capacity_state", flat=True)),
            DeliveryReconciliation.objects.filter(operation=op).count(),
            AuditRecord.objects.filter(entity_type="effects.DeliveryOperation", entity_id=str(op.pk)).count())


def test_reconciliation_refusals_change_nothing(world, sync_receiver):
    """Refused reconciliations write nothing: a user without `effects.reconcile_delivery` or a system actor
    (DeliveryPermissionDenied) may neither open nor resolve; a resolution without its proof, with a count that
    contradicts the target's effect, without a source, with a malformed evidence digest, or under another
    reconciliation ID is DeliveryRequestInvalid.
    Proves: reconciliation_preserves_acknowledgement_while_resolving_effect (operator approval and proof are the
    CAS of every operator-only transition), unknown_remote_job_retains_capacity_until_reconciliation."""
    op = unknown_success(world, sync_receiver)
    nobody = Actor.for_user(operator("delivery-nobody"))
    admin = Actor.for_user(world.admin)

    before = _snapshot(op)
    for actor in (nobody, Actor.system("delivery")):
        with pytest.raises(DeliveryPermissionDenied):
            reconcile_open(actor=actor, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-x")
        assert _snapshot(op) == before

    reconcile_open(actor=admin, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-2")
    opened = _snapshot(op)
    assert opened[0] == "reconciling_unknown_success_ack"

    with pytest.raises(DeliveryPermissionDenied):
        reconcile_resolve(actor=nobody, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id="rec-2",
                          target="final_no_effect_success_ack", proof={"applied_count": 0, "source": "q"})
    assert _snapshot(op) == opened

    invalid = [
        ("rec-2", "final_full_eligible", None),                                           # no proof
        ("rec-2", "final_full_eligible", {"applied_count": 1, "source": "q"}),            # 1 of 2 is not full
        ("rec-2", "final_no_effect_success_ack", {"applied_count": 2, "source": "q"}),    # 2 is not none
        ("rec-2", "final_partial_success_ack", {"applied_count": 2, "source": "q"}),      # 2 of 2 is not partial
        ("rec-2", "final_partial_success_ack", {"applied_count": 0, "source": "q"}),      # 0 is not partial
        ("rec-2", "final_no_effect_success_ack", {"applied_count": 0}),                   # no source
        ("rec-2", "final_no_effect_success_ack", {"applied_count": True, "source": "q"}),  # not a count
        ("rec-2", "final_unknown_success_ack", {"evidence_digest": "XYZ"}),               # malformed digest
        ("rec-2", "final_full_promoted", {"applied_count": 2, "source": "q"}),            # not a legal target
        ("rec-other", "final_no_effect_success_ack", {"applied_count": 0, "source": "q"}),  # other reconciliation
    ]
    for rec_id, target, proof in invalid:
        with pytest.raises(DeliveryRequestInvalid):
            reconcile_resolve(actor=admin, operation_pk=op.pk, expected_revision=DeliveryOperation.objects.get(pk=op.pk).revision, reconciliation_id=rec_id, target=target, proof=proof)
        assert _snapshot(op) == opened, (rec_id, target, proof)
    op.refresh_from_db()
    assert op.axis("acknowledgement") == "SUCCEEDED"
    assert op.attempts.get().capacity_state == CapacityState.RESERVED


def test_reconciliation_preserves_acknowledgement_while_resolving_effect():
    """Every operator-only transition of the contract keeps the acknowledgement axis, and every unknown
    reconciliation can reach none, full, partial and unknown.
    Proves: reconciliation_preserves_acknowledgement_while_resolving_effect,
    every_unknown_reconciliation_can_resolve_none_full_partial_or_remain_unknown."""
    c = contract()
    operator_only = [t for t in c.transitions if t.operator_only]
    assert operator_only
    for t in operator_only:
        assert c.axis(t.source, "acknowledgement") == c.axis(t.target, "acknowledgement"), t
    for state in c.tuples_where(execution="VERIFYING", remote_effect="UNKNOWN"):
        effects = {c.axis(t.target, "remote_effect") for t in operator_only if t.source == state}
        assert effects == {"NONE_PROVEN", "FULLY_APPLIED", "PARTIALLY_APPLIED", "UNKNOWN"}, (state, effects)


def test_ambiguous_transport_is_unknown_never_retried(world, sync_receiver):
    """Beyond the ten scenarios: an answer that is not definite after the receiver applied the batch (connection
    reset, 5xx, unparsable body) makes the effect unknown (submitting -> final_unknown_not_accepted,
    REST_DELIVERY_REMOTE_EFFECT_UNKNOWN); capacity stays reserved and no second request is ever sent.
    Proves: unknown_remote_job_retains_capacity_until_reconciliation."""
    for i, mode in enumerate(("drop", "error_5xx", "garbage")):
        sync_receiver.queue(mode)
        op = run_to_final(single_child(world, parent_key=f"amb-{i}", group=f"amb-{i}",
                                        namespace={**NAMESPACE, "tenant_id": f"tenant-amb-{i}"}).pk)
        assert op.state == "final_unknown_not_accepted", (mode, op.state)
        assert ("submitting", "final_unknown_not_accepted") in transitions(op)
        assert op.last_code == "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN"
        assert op.axis("acknowledgement") == "NOT_ACCEPTED"
        assert op.attempts.get().capacity_state == CapacityState.RESERVED
        key = bytes(op.receiver_mutation_key).hex()
        assert sync_receiver.applied[key] == 1
        assert runner.step(op.pk) == "final_unknown_not_accepted"
        assert [m["key"] for m in sync_receiver.mutations()].count(key) == 1
