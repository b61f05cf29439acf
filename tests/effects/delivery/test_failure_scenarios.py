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

from connector.models import AuditRecord
from effects.delivery.contract import contract
from effects.delivery.receiver import DeliveryReceiver
from effects.models import DeliveryAttempt, DeliveryObservation, DeliveryOperation, MayAttemptMarker
from effects.models.delivery import CapacityState
from effects.services.delivery import execution, runner
from tests.effects.delivery.world import T0, build

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
