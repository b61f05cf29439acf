"""Every halted or quarantined reason has a way out that works, or is documented as terminal with its reason.

`test_every_reason_has_a_proven_remedy_or_a_documented_terminal_reason` enumerates the closed reason map
(governance/reasons.py): each code maps to a remedy; a terminal one says why and is documented in the operator
guide; every other one is proven by a scenario below, which creates the halted or quarantined item through the
product, finds it on the board (and in the queue when it waits for a human), takes the remedy through the service an
authorized person uses, and sees the item leave. A code added without a remedy, a scenario or a terminal reason
fails here (CV2-13-001, CV2-13-007)."""
from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone

from connector.actors import Actor
from effects.delivery.contract import contract
from governance import selectors
from governance.reasons import REASONS, reason

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS: dict[str, Callable] = {}
# A remedy whose end-to-end proof needs child processes of a V1 deployment lives in that suite.
PROVEN_ELSEWHERE = {
    "V1_IO_MAY_HAVE_STARTED": ("tests/governance/test_cutover_attempt_console.py",
                               "test_an_approver_walks_the_v1_phases_and_reconciles_an_interrupted_effect"),
    # poison items released after the fix, each by its own suite (decision D-168)
    "MATERIALIZATION_FAILED": ("tests/connector/test_poison_items.py",
                               "test_a_released_receipt_is_materialized_by_the_next_sweep"),
    "LANE_STEP_FAILED": ("tests/connector/test_poison_items.py",
                         "test_a_lane_whose_advance_fails_halts_and_the_other_lanes_advance"),
    "EFFECT_STEP_FAILED": ("tests/effects/test_poison_effects.py",
                           "test_a_finalization_failure_holds_that_effect_and_the_sweep_finalizes_the_others"),
    "DELIVERY_STEP_FAILED": ("tests/effects/delivery/test_poison_delivery.py",
                             "test_a_delivery_step_failure_holds_that_operation_and_the_others_complete"),
    # uncertain effects under a frozen idempotency contract (issue 37 item 2, D-430): repeated by the sweeper, then
    # held for a person, whose reconciliation lifts the hold
    "UNCERTAIN_REPEAT_SCHEDULED": ("tests/effects/test_uncertain_recovery.py",
                                   "test_repeats_back_off_doubling_then_stop_with_uncertain_repeats_spent_until_a_"
                                   "person_reconciles"),
    "UNCERTAIN_REPEATS_SPENT": ("tests/effects/test_uncertain_recovery.py",
                                "test_repeats_back_off_doubling_then_stop_with_uncertain_repeats_spent_until_a_"
                                "person_reconciles"),
    "UNCERTAIN_KEY_RETENTION_PASSED": ("tests/effects/test_uncertain_recovery.py",
                                       "test_a_repeat_past_half_the_key_retention_waits_with_uncertain_key_retention_"
                                       "passed"),
    "EPOCH_VERIFY_FAILED": ("tests/connector/test_poison_items.py",
                            "test_an_epoch_whose_verification_fails_is_recorded_and_the_sweep_verifies_the_others"),
}


def scenario(code: str):
    def register(fn):
        SCENARIOS[code] = fn
        return fn
    return register


def person(name: str, *groups: str) -> User:
    user = User.objects.create_user(name, password="pw")
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def later(seconds: int):
    return mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(seconds=seconds))


def items(code: str) -> list:
    return selectors.board().get(code, [])


def waiting(code: str) -> list:
    return [item for item in selectors.queue() if item.code == code]


def test_every_reason_has_a_proven_remedy_or_a_documented_terminal_reason():
    """Each closed reason code has a remedy kind; terminal ones give their reason and are documented; the others
    are proven by a scenario here (delivery codes by the delivery reconciliation scenario and the contract, which
    leaves no waiting tuple without an operator move), or by the named suite."""
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    waiting_states = [s for s in contract().tuples if re.match(selectors.WAITING_DELIVERY, s)]
    operator_moves = {t.source for t in contract().transitions if t.operator_only}
    unproven = []
    for code in REASONS:
        remedy = reason(code).remedy
        assert remedy.kind != "unmapped", f"{code} has no remedy mapped"
        assert f"`{code}`" in guide, f"{code} is missing from the operator guide's table of reasons"
        if remedy.kind == "terminal":
            assert remedy.terminal and not remedy.queue, code
        elif code in SCENARIOS or code in PROVEN_ELSEWHERE:
            continue
        elif remedy.kind == "reconcile_delivery":
            assert "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN" in SCENARIOS
            assert waiting_states and set(waiting_states) <= operator_moves, set(waiting_states) - operator_moves
        elif remedy.kind == "journal_epoch":
            assert "DELIVERY_GATE_BLOCKED" in SCENARIOS
        else:
            unproven.append(code)
    assert unproven == []
    for code, (path, name) in PROVEN_ELSEWHERE.items():
        source = (ROOT / path).read_text()
        body = source.split(f"def {name}(", 1)[1].split("\ndef ", 1)[0] if f"def {name}(" in source else ""
        assert body, f"{code}: {path} has no test {name}"
        assert code in body or code in source, f"{code}: {path}::{name} does not name the reason"
        release = {"poison_release": "poison_release", "epoch_reject": "epoch_reject"}.get(reason(code).remedy.kind)
        assert release is None or release in body, f"{code}: {path}::{name} does not run the remedy ({release})"


# -- outbound -----------------------------------------------------------------------------------------------------

@scenario("EFFECT_UNCERTAIN")
def _uncertain(request):
    from effects.services.dispatch import effect_reconcile
    from tests.effects.helpers import author
    from effects.services import worker

    world, receiver = request.getfixturevalue("push_world"), request.getfixturevalue("receiver")
    author(world.accounts[0])
    receiver.default_mode = "apply_5xx"
    effect = worker.effect_dispatch_once(holder_name="h-rem", account_id=world.accounts[0].pk)
    assert [i.pk for i in waiting("EFFECT_UNCERTAIN")] == [effect.pk]
    effect_reconcile(effect_pk=effect.pk, decision="no_effect", evidence="provider: nothing [T]",
                     actor=Actor.for_user(person("op", "operator")), expected_changed_at=effect.changed_at)
    assert items("EFFECT_UNCERTAIN") == []


@scenario("REMOTE_LINK_CONFLICT")
def _conflict(request):
    from effects.services import identity
    from tests.effects.test_remote_identity import dispatch, push

    world, receiver = request.getfixturevalue("push_world"), request.getfixturevalue("receiver")
    acme = world.accounts[0]
    push(acme, "r1", 1)
    dispatch(acme)
    push(acme, "r1", 2)
    receiver.modes = ["new_identity"]
    effect = dispatch(acme)
    assert [i.pk for i in waiting("REMOTE_LINK_CONFLICT")] == [effect.pk]
    assert identity.effect_link_keep(effect_pk=effect.pk, evidence="CRM shows the linked record changed [T]",
                                     actor=Actor.for_user(person("op", "operator")),
                                     expected_changed_at=effect.changed_at).state == "finalized"
    assert items("REMOTE_LINK_CONFLICT") == []


def _ended_no_effect(request, prefix: str, code: str, mode: str | None):
    """An effect the frozen policy ends terminal `no_effect` with `code` (issue 37, D-423): a callout whose retry
    schedule is one second, the receiver refusing (`mode`) or not listening (None); then the remedy, a new remote
    call authorized by an operator, and the item leaves the board (its successor carries on)."""
    from connector import demo
    from effects.services import intents, worker
    from tests.effects.test_remote_identity import push
    from tests.faults.servers import free_port

    monkeypatch, settings = request.getfixturevalue("monkeypatch"), request.getfixturevalue("settings")
    receiver = request.getfixturevalue("receiver")
    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION, "retry": {"schedule_seconds": [1]}})
    account = demo.build_world(prefix, push=True).accounts[0]
    push(account, "r1", 1)  # Runtime authors the push, naming its owner slot (a new remote call repeats it)
    if mode is None:
        settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": f"http://127.0.0.1:{free_port()}"}
    else:
        receiver.default_mode = mode
    effect = None
    for step in range(4):
        with later(2 * step):
            effect = worker.effect_dispatch_once(holder_name="h-rem", account_id=account.pk) or effect
    assert effect.state == "no_effect" and effect.quarantine_reason == code
    assert [i.pk for i in waiting(code)] == [effect.pk]
    intent = intents.remote_call_for_effect(effect_pk=effect.pk, reason="receiver back [T]",
                                            actor=Actor.for_user(person("op", "operator")),
                                            expected_changed_at=effect.changed_at)
    assert intent.disposition == "successor"
    assert items(code) == []


@scenario("RECEIVER_UNREACHABLE")
def _unreachable(request):
    _ended_no_effect(request, "ru-", "RECEIVER_UNREACHABLE", None)


@scenario("NO_EFFECT_ATTEMPTS_SPENT")
def _attempts_spent(request):
    _ended_no_effect(request, "ra-", "NO_EFFECT_ATTEMPTS_SPENT", "refuse")


@scenario("LINKED_RECORD_NOT_FOUND")
def _linked_record_gone(request):
    """An update addressed at the slot's linked identity answered 404 on every attempt ends `no_effect` with
    LINKED_RECORD_NOT_FOUND (D-481); once the record exists at the provider again, an operator authorizes a new
    remote call: the item leaves the board and the successor's update finalizes."""
    from connector import demo
    from effects.services import intents, worker
    from tests.effects.test_remote_identity import push

    receiver = request.getfixturevalue("receiver")
    account = demo.build_world("rg-", push=True).accounts[0]
    push(account, "r1", 1)
    assert worker.effect_dispatch_once(holder_name="h-rg", account_id=account.pk).state == "finalized"
    push(account, "r1", 2)
    receiver.default_mode = "gone"
    for _ in range(3):
        effect = worker.effect_dispatch_once(holder_name="h-rg", account_id=account.pk)
    assert (effect.state, effect.quarantine_reason) == ("no_effect", "LINKED_RECORD_NOT_FOUND")
    assert [i.pk for i in waiting("LINKED_RECORD_NOT_FOUND")] == [effect.pk]
    intent = intents.remote_call_for_effect(effect_pk=effect.pk, reason="record restored at the provider [T]",
                                            actor=Actor.for_user(person("op", "operator")),
                                            expected_changed_at=effect.changed_at)
    assert intent.disposition == "successor"
    assert items("LINKED_RECORD_NOT_FOUND") == []
    receiver.default_mode = "ok"
    assert worker.effect_dispatch_once(holder_name="h-rg", account_id=account.pk).state == "finalized"


# -- executions and lanes -----------------------------------------------------------------------------------------

def _strict_world():
    from tests.conformance.packs import PACK_B, variant
    from tests.connector.inbound_helpers import build_inbound_world

    quarantine = {"applied": "advance", "noop": "advance", "rejected": "quarantine", "failed": "quarantine"}
    return build_inbound_world("rm-", [variant(PACK_B, "ledger.sequenced", terminal_disposition=quarantine)])


def _send(world, seq: int, **kw) -> None:
    from tests.connector.inbound_helpers import deliver, feed_body, feed_line

    deliver(world, "ledger.sequenced", feed_body(feed_line(f"ln-{seq}", seq, "mem-1", **kw)))


@scenario("RESULT_FAILED")
def _failed(request):
    """Runtime reports failure (once): the replay runs, the partition resumes, 2 and 3 apply."""
    from connector.services import replay, runtime
    from tests.connector.inbound_helpers import drain

    request.getfixturevalue("db")
    world = _strict_world()
    _send(world, 1)
    drain()
    with mock.patch.object(runtime, "_apply_record", return_value="failed"):
        _send(world, 2)
        drain()
    _send(world, 3)
    drain()
    execution_item, = [i for i in waiting("RESULT_FAILED") if i.kind == "execution"]
    assert {i.kind for i in waiting("RESULT_FAILED")} == {"execution", "lane"}
    assert execution_item.hint.startswith("Replay runs")
    from connector.models import Execution

    failed = Execution.objects.get(pk=execution_item.pk)
    replay.execution_replay(execution_pk=failed.pk, reason="runtime fixed [T]",
                            actor=Actor.for_user(person("op", "operator")), expected_changed_at=failed.changed_at)
    drain()
    assert items("RESULT_FAILED") == []
    assert Execution.objects.filter(state="completed").count() == 3


@scenario("EXECUTION_STEP_FAILED")
def _step_failed(request):
    """Runtime's apply raises a bug (not a catalog error) for 2: the worker quarantines it with
    EXECUTION_STEP_FAILED and halts the partition; after the fix the replay runs and 2 and 3 apply."""
    from connector import tasks
    from connector.models import Execution
    from connector.services import replay, runtime
    from tests.connector.inbound_helpers import advance_lanes, drain

    request.getfixturevalue("db")
    world = _strict_world()
    _send(world, 1)
    drain()
    _send(world, 2)
    advance_lanes()
    # The bug is in Runtime's apply, on both of its paths: the worker's batch (D-254) rolls back and falls back to
    # the per-command path, which raises it again; poison isolation quarantines the Execution.
    with mock.patch.object(runtime, "_apply_record", side_effect=RuntimeError("bug in 1.2.3")), \
            mock.patch.object(runtime, "_apply_planned", side_effect=RuntimeError("bug in 1.2.3")):
        tasks.execution_claim_and_run()
    _send(world, 3)
    drain()
    execution_item, = [i for i in waiting("EXECUTION_STEP_FAILED") if i.kind == "execution"]
    failed = Execution.objects.get(pk=execution_item.pk)
    replay.execution_replay(execution_pk=failed.pk, reason="fix 1.2.4 deployed [T]",
                            actor=Actor.for_user(person("op", "operator")), expected_changed_at=failed.changed_at)
    drain()
    assert items("EXECUTION_STEP_FAILED") == []
    assert Execution.objects.filter(state="completed").count() == 3


@scenario("RESULT_REJECTED")
def _rejected(request):
    """Runtime rejects 2 under a quarantine policy; the source's evidence that a corrected 3 supersedes it lets
    the operator resume the lane past it."""
    from connector.models import OrderingLane
    from connector.services import lanes
    from tests.connector.inbound_helpers import drain

    request.getfixturevalue("db")
    world = _strict_world()
    _send(world, 1)
    _send(world, 2, payee_email="not-an-address")
    _send(world, 3)
    drain()
    assert {i.kind for i in waiting("RESULT_REJECTED")} == {"execution", "lane"}
    lane = OrderingLane.objects.get(partition="mem-1")
    lanes.lane_resume(lane_pk=lane.pk, mode="skip_with_evidence", evidence="source: 3 corrects 2 [T]",
                      actor=Actor.for_user(person("op", "operator")), expected_fence=lane.fence)
    drain()
    assert items("RESULT_REJECTED") == [] and OrderingLane.objects.get(pk=lane.pk).high_water == 3


def _dependency_world():
    from tests.connector.inbound_helpers import build_inbound_world
    from tests.connector.test_dependencies import PACK

    return build_inbound_world("rd-", [PACK])


def _replay_dependency(code: str) -> None:
    from connector.models import Execution
    from connector.services import replay, sweeper
    from tests.connector.inbound_helpers import run_ready
    from tests.connector.test_dependencies import send

    world = _dependency_world()
    child, = send(world, "child-1", "rec-child", parent="parent-1")
    if code == "DEPENDENCY_EXPIRED":
        with later(121):
            sweeper.inbound_sweep(grace_seconds=0)
    else:
        from connector.models import ExecutionDependency
        from connector.services import dependencies

        dependencies.dependency_resolve(dependency_pk=ExecutionDependency.objects.get().pk,
                                        reject_evidence="parent deleted at source")
    item, = waiting(code)
    assert item.pk == child and item.hint.startswith("Replay runs")
    send(world, "parent-1", "rec-parent")  # the dependency now exists
    run_ready()
    quarantined = Execution.objects.get(pk=child)
    admission = replay.execution_replay(execution_pk=child, reason="parent restored [T]",
                                        actor=Actor.for_user(person("op", "operator")),
                                        expected_changed_at=quarantined.changed_at)
    sweeper.inbound_sweep(grace_seconds=0)
    run_ready()
    assert items(code) == []
    rerun = Execution.objects.get(projection__event__replay_request=admission.request)
    assert rerun.state == "completed" and Execution.objects.get(pk=child).state == "quarantined"


@scenario("DEPENDENCY_EXPIRED")
def _expired(request):
    request.getfixturevalue("db")
    _replay_dependency("DEPENDENCY_EXPIRED")


@scenario("DEPENDENCY_REJECTED")
def _dependency_rejected(request):
    request.getfixturevalue("db")
    _replay_dependency("DEPENDENCY_REJECTED")


@scenario("GAP_DEADLINE")
def _gap(request):
    from connector.models import OrderingLane
    from connector.services import lanes, sweeper
    from tests.connector.inbound_helpers import drain

    request.getfixturevalue("db")
    world = _strict_world()
    for seq in (1, 3):
        _send(world, seq)
    drain()
    with later(31):
        sweeper.inbound_sweep(grace_seconds=0)
    item, = waiting("GAP_DEADLINE")
    _send(world, 2)
    lane = OrderingLane.objects.get(pk=item.pk)
    lanes.lane_resume(lane_pk=lane.pk, mode="missing_arrived", evidence="provider resent 2 [T]",
                      actor=Actor.for_user(person("op", "operator")), expected_fence=lane.fence)
    drain()
    assert items("GAP_DEADLINE") == [] and OrderingLane.objects.get(pk=lane.pk).high_water == 3


# -- gates --------------------------------------------------------------------------------------------------------

@scenario("GATE_HALTED")
def _gate(request):
    from connector.services.gates import gate_transition

    world = request.getfixturevalue("world")
    account = world.accounts[0]
    operator = Actor.for_user(person("op", "operator"))
    for action in ("halt_v2", "confirm_halted"):
        gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=operator, reason="drill")
    assert [i.pk for i in items("GATE_HALTED")] == [account.serving_gate.pk] and waiting("GATE_HALTED") == []
    gate_transition(account_id=account.pk, action="resume_predecessor", expected_fence=None, actor=operator,
                    reason="drill over")
    assert items("GATE_HALTED") == []


@scenario("CREDENTIAL_REVOKED")
def _credential(request):
    from connector.services.gates import credential_gate_transition

    world = request.getfixturevalue("world")
    generation = world.credential_generation_ids[0]
    actor = Actor.system("security")
    credential_gate_transition(generation_id=generation, action="revoke", expected_fence=None, actor=actor,
                               reason="key leaked")
    assert len(items("CREDENTIAL_REVOKED")) == 1
    credential_gate_transition(generation_id=generation, action="reenable", expected_fence=None, actor=actor,
                               reason="rotation verified by security")
    assert items("CREDENTIAL_REVOKED") == []


# -- delivery -----------------------------------------------------------------------------------------------------

@pytest.fixture
def delivery(db):
    from tests.effects.delivery.receiver import DeliveryReceiver
    from tests.effects.delivery.world import build

    receiver = DeliveryReceiver(kind="sync_batch", default="count_missing").start()
    try:
        yield build(receiver.url), receiver
    finally:
        receiver.stop()


@scenario("REST_DELIVERY_REMOTE_EFFECT_UNKNOWN")
def _delivery(request):
    """The receiver's answer proves nothing: the operation waits; a reconciliation with the receiver's export as
    proof resolves it (the representative of every delivery code's remedy)."""
    from effects.models import DeliveryOperation
    from effects.services.delivery import reconciliation, runner

    world, _ = request.getfixturevalue("delivery")
    parent = world.plan(records=[{"at": "2026-11-01T00:00:00+00:00", "id": "a"},
                                 {"at": "2026-11-01T00:00:00+00:00", "id": "b"}])
    runner.drive_parent(parent.pk)
    op = DeliveryOperation.objects.get(pk=parent.children.first().pk)
    assert [i.pk for i in selectors.queue() if i.kind == "delivery"] == [op.pk]
    assert reason(op.last_code or "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN").remedy.kind == "reconcile_delivery"
    actor = Actor.for_user(world.admin)
    reconciliation.reconcile_open(actor=actor, operation_pk=op.pk, reconciliation_id="REC-1", note="checking",
                                  expected_revision=op.revision)
    op.refresh_from_db()
    reconciliation.reconcile_resolve(actor=actor, operation_pk=op.pk, reconciliation_id="REC-1",
                                     target="final_full_eligible", note="receiver export shows every row",
                                     proof={"applied_count": op.record_count, "source": "receiver export"},
                                     expected_revision=op.revision)
    assert not [i for i in selectors.queue() if i.kind == "delivery"]


@scenario("DELIVERY_GATE_BLOCKED")
def _journal(request):
    from effects.delivery.errors import DeliveryError
    from effects.services.delivery import execution, journal

    world, _ = request.getfixturevalue("delivery")
    parent = world.plan(parent_key="blocked")
    journal.attest_epoch(epoch=2, reason="restore", actor=Actor.system("restore-tooling"))
    with pytest.raises(DeliveryError):
        execution.submit(parent.children.first().pk)
    assert len(waiting("DELIVERY_GATE_BLOCKED")) == 1
    campaign = journal.campaign_start(actor=Actor.for_user(world.approver), campaign_id="c-1", reason="restore")
    journal.campaign_complete(actor=Actor.for_user(world.approver), campaign=campaign, findings=[])
    journal.gate_unblock(actor=Actor.for_user(world.admin), campaign=campaign)
    assert items("DELIVERY_GATE_BLOCKED") == []


# Collected after every scenario above has registered.
@pytest.mark.parametrize("code", sorted(SCENARIOS))
def test_the_remedy_works(code, request):
    """Create the item through the product, find it on the board (and in the queue if it waits for a human), take
    the remedy through its service as an authorized person, and see the item leave. Proves: CV2-13-001,
    CV2-13-002, CV2-13-005, CV2-13-007"""
    SCENARIOS[code](request)
