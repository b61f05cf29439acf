"""An intentional new remote call is a separate operator-authorized business intent (D-305..D-308): its admission
locks and reconciles every predecessor RemoteEffect of the same EffectRoot and slot, then resumes an open one,
rejects when the effect occurred, blocks while one is unproven, and mints a successor EffectGenerationID (linked,
newly frozen, sent through the one egress path) only after every predecessor is proven terminal `no_effect`."""
from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from connector.actors import Actor
from connector.models import AccountServingGate, AuditRecord
from effects.errors import RemoteCallBlocked, RemoteCallEffectOccurred, RemoteCallRefused
from effects.models import OutboundCommand, RemoteCallIntent, RemoteEffect
from connector.services.guard import lock_serving
from effects.services import dispatch, intents, outbound, worker
from tests.concurrency import run_concurrently
from tests.effects.helpers import acquire, author, build_push_world, refused_by, send

SLOT = "push:records.push"


def _intent(account, intent_id: str, *, root: str = "order-1", reason: str = "customer asked for a resend",
            principal: str = "operator:olga", slot: str = SLOT) -> RemoteCallIntent:
    return intents.remote_call_authorize(
        account_key=account.account_key, intent_id=intent_id, application_scope="runtime.records",
        effect_root_id=root, effect_slot_id=slot, body={"record_key": "r1", "name": "Ann"},
        path_params={"record_id": "r1", "record_key": "r1"}, reason=reason, actor=Actor(principal=principal))


def _dispatch(account):
    return worker.effect_dispatch_once(holder_name="h-intent", account_id=account.pk)


def _proven_no_effect(account, receiver, root: str = "order-1") -> OutboundCommand:
    """A command the receiver refuses (422) on every attempt the frozen policy allows: terminal `no_effect`."""
    command = author(account, root=root)
    receiver.default_mode = "refuse"
    while RemoteEffect.objects.get(command=command).state == "prepared":
        _dispatch(account)
    assert RemoteEffect.objects.get(command=command).state == "no_effect"
    receiver.default_mode = "ok"
    return command


def _runtime_no_effect(account, receiver) -> OutboundCommand:
    """An event whose Runtime transaction authors the command (owner slot r1), refused until terminal no_effect."""
    import json

    from connector.services import admission, execution, materialize

    body = json.dumps({"events": [{"id": "e1", "type": "t", "record_id": "r1", "sequence": 1,
                                   "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": "Ann", "email": "ann@example.com"}}]}).encode()
    adm = admission.receipt_admit(account_key=account.account_key, channel="records.webhook", transport_key="k",
                                  body=body, actor=Actor.system("t"))
    for lane in materialize.receipt_materialize(receipt_pk=adm.receipt.pk).lanes:
        execution.lane_advance(lane_pk=lane)
    execution.execution_run(token=execution.execution_claim(holder="w"))
    command = OutboundCommand.objects.get()
    assert command.owner_slot == "r1"
    receiver.default_mode = "refuse"
    while RemoteEffect.objects.get(command=command).state == "prepared":
        _dispatch(account)
    receiver.default_mode = "ok"
    assert RemoteEffect.objects.get(command=command).state == "no_effect"
    return command


def _nothing_written(before: tuple[int, int, int]) -> None:
    assert (RemoteCallIntent.objects.count(), OutboundCommand.objects.count(), AuditRecord.objects.count()) == before


def _counts() -> tuple[int, int, int]:
    return RemoteCallIntent.objects.count(), OutboundCommand.objects.count(), AuditRecord.objects.count()


@pytest.mark.django_db
def test_a_prepared_or_dispatching_predecessor_is_resumed_and_no_new_effect_exists(push_world, receiver):
    """A root whose g1 effect is `prepared`: the intent is admitted as `resumed`, names that effect, reconciled
    it (its state recorded) and authors nothing; the same while the effect is `dispatching` under a granted
    permit. The resumed effect then completes on the normal path: the receiver applied the call once. Asking
    again with the same intent ID returns the recorded intent; different bytes, an empty reason or a root with no
    effect are REMOTE_CALL_REFUSED and write nothing.
    Proves: CV2-09-020, CV2-09-021"""
    acme = push_world.accounts[0]
    command = author(acme)
    effect = RemoteEffect.objects.get(command=command)
    first = _intent(acme, "i-prepared")
    assert (first.disposition, first.resumed_effect_id, first.successor_command_id) == ("resumed", effect.pk, None)
    assert first.reconciled == [{"effect": effect.pk, "generation": "g1", "state": "prepared"}]
    assert first.principal == "operator:olga" and OutboundCommand.objects.count() == 1
    assert AuditRecord.objects.filter(action="remote_call_authorize_resumed", entity_id=str(first.pk)).exists()
    assert _intent(acme, "i-prepared").pk == first.pk

    before = _counts()
    for kwargs, code in (({"reason": "another reason"}, "mismatch"), ({"reason": "  "}, "reason"),
                         ({"root": "order-none"}, "no RemoteEffect")):
        with pytest.raises(RemoteCallRefused, match=code if code != "mismatch" else "different bytes"):
            _intent(acme, "i-prepared" if code == "mismatch" else "i-x", **kwargs)
    _nothing_written(before)

    ready = acquire("h-open", acme)
    assert RemoteEffect.objects.get(pk=effect.pk).state == "dispatching"
    second = _intent(acme, "i-dispatching")
    assert (second.disposition, second.resumed_effect_id) == ("resumed", effect.pk)
    assert second.reconciled[0]["state"] == "dispatching" and OutboundCommand.objects.count() == 1
    send(ready)
    assert RemoteEffect.objects.get(pk=effect.pk).state in ("remote_confirmed", "finalized")
    assert receiver.applied_total() == 1 and len(receiver.requests) == 1


@pytest.mark.django_db
def test_a_confirmed_or_finalized_predecessor_rejects_a_new_generation(push_world, receiver, monkeypatch):
    """A root whose effect the receiver applied and the worker finalized, and a root whose effect is
    `remote_confirmed` (sent, not yet finalized): both prove the call happened, so the intent is
    REMOTE_CALL_EFFECT_OCCURRED, writes nothing (no intent, command or audit row) and the receiver is not called
    again. Proves: CV2-09-020, CV2-09-022"""
    acme = push_world.accounts[0]
    author(acme, root="order-fin")
    assert _dispatch(acme).state == "finalized"
    author(acme, root="order-conf", record_id="r2")
    from effects.services import dispatch_batch

    with monkeypatch.context() as held:  # the finalization in the settlement fails: left remote_confirmed
        held.setattr(dispatch_batch, "_finalize_in_savepoint", lambda **kwargs: None)
        assert send(acquire("h-conf", acme)).state == "remote_confirmed"
    before, requests = _counts(), len(receiver.requests)
    for root, state in (("order-fin", "finalized"), ("order-conf", "remote_confirmed")):
        with pytest.raises(RemoteCallEffectOccurred, match=state) as refused:
            _intent(acme, f"i-{root}", root=root)
        assert refused.value.code == "REMOTE_CALL_EFFECT_OCCURRED"
    _nothing_written(before)
    assert len(receiver.requests) == requests == 2


@pytest.mark.django_db
def test_an_uncertain_predecessor_blocks_until_reconciliation_proves_it(push_world, receiver):
    """Root A: two refusals, then the receiver applies and answers 500: `uncertain` after the third attempt. The
    intent is REMOTE_CALL_BLOCKED and writes nothing. The operator reconciles it proven no_effect; the policy is
    exhausted, so it is terminal `no_effect`, and the same intent is now admitted as a successor. Root B:
    `uncertain` blocks; reconciled `remote_confirmed`, the intent is rejected as occurred. Proves: CV2-09-023"""
    acme = push_world.accounts[0]
    a = author(acme, root="order-a")
    receiver.modes = ["refuse", "refuse", "apply_5xx"]
    while RemoteEffect.objects.get(command=a).state == "prepared":
        _dispatch(acme)
    effect = RemoteEffect.objects.get(command=a)
    assert effect.state == "uncertain"
    b = author(acme, root="order-b", record_id="r2")
    receiver.modes = ["apply_5xx"]
    assert _dispatch(acme).state == "uncertain"
    effect_b = RemoteEffect.objects.get(command=b)
    before = _counts()
    with pytest.raises(RemoteCallBlocked, match="uncertain"):
        _intent(acme, "i-a", root="order-a")
    _nothing_written(before)
    dispatch.effect_reconcile(effect_pk=effect.pk, decision="no_effect", evidence="provider has no such record",
                              actor=Actor.system("t"), expected_changed_at=effect.changed_at)
    assert RemoteEffect.objects.get(pk=effect.pk).state == "no_effect"
    admitted = _intent(acme, "i-a", root="order-a")
    assert admitted.disposition == "successor" and admitted.predecessor_effect_id == effect.pk

    with pytest.raises(RemoteCallBlocked):
        _intent(acme, "i-b", root="order-b")
    dispatch.effect_reconcile(effect_pk=effect_b.pk, decision="remote_confirmed", evidence="provider shows it",
                              remote_id="remote-b", actor=Actor.system("t"), expected_changed_at=effect_b.changed_at)
    with pytest.raises(RemoteCallEffectOccurred):
        _intent(acme, "i-b", root="order-b")


@pytest.mark.django_db
def test_a_successor_generation_only_after_proven_no_effect_linked_and_newly_frozen(push_world, receiver):
    """g1 is refused until its policy is exhausted (terminal `no_effect`). The intent mints exactly one successor
    `intent:i-1`: same scope, root and slot, explicit predecessor linkage (FK and the predecessor's binding
    digest), a new frozen binding bound to the gate's current fence and epoch, a `prepared` effect that the normal
    worker sends through the egress adapter and finalizes. A successor that again ends `no_effect` admits the next
    generation, linked to it (not to g1); once a generation is finalized, further intents are rejected. PostgreSQL
    refuses a second chain head for the root and slot and a second successor of one predecessor; the intent row
    is append-only. Proves: CV2-09-020, CV2-09-024"""
    acme = push_world.accounts[0]
    g1 = _proven_no_effect(acme, receiver)
    receiver.default_mode = "refuse"
    first = _intent(acme, "i-1")
    successor = first.successor_command
    assert (first.disposition, first.predecessor_effect_id) == ("successor", RemoteEffect.objects.get(command=g1).pk)
    assert (successor.application_scope, successor.effect_root_id, successor.effect_slot_id,
            successor.effect_generation_id) == (g1.application_scope, "order-1", SLOT, "intent:i-1")
    assert successor.predecessor_id == g1.pk and bytes(successor.predecessor_digest) == bytes(g1.binding_digest)
    assert bytes(successor.binding_digest) != bytes(g1.binding_digest)
    assert bytes(successor.idempotency_key) != bytes(g1.idempotency_key)
    gate = AccountServingGate.objects.get(account=acme)
    assert (successor.gate_fence, successor.epoch_id) == (gate.fence, gate.epoch_id)
    assert RemoteEffect.objects.get(command=successor).state == "prepared"
    assert _intent(acme, "i-1").pk == first.pk and OutboundCommand.objects.count() == 2
    # In PostgreSQL: a second chain head for the root and slot (a new generation without predecessor linkage) and a
    # second successor of the same predecessor are refused, whoever writes them.
    with pytest.raises(IntegrityError, match="effects_command_one_chain_head"):
        author(acme, generation="g-unlinked")
    with pytest.raises(IntegrityError, match="successor|predecessor_id"), transaction.atomic():
        ctx = lock_serving(account_id=acme.pk)
        outbound.outbound_command_author(
            ctx=ctx, account_key=acme.account_key, application_scope=g1.application_scope, effect_root_id="order-1",
            effect_slot_id=SLOT, effect_generation_id="g-second-successor", push_contract=g1.effect_definition,
            callout=g1.callout, path_params={"record_id": "r1", "record_key": "r1"}, body={"record_key": "r1"},
            suppress_external_effects=False, predecessor=g1)

    while RemoteEffect.objects.get(command=successor).state == "prepared":
        _dispatch(acme)
    assert RemoteEffect.objects.get(command=successor).state == "no_effect"
    receiver.default_mode = "ok"
    second = _intent(acme, "i-2")
    third = second.successor_command
    assert third.predecessor_id == successor.pk and third.effect_generation_id == "intent:i-2"
    assert second.reconciled == [{"effect": e.pk, "generation": e.command.effect_generation_id, "state": "no_effect"}
                                 for e in RemoteEffect.objects.filter(command__in=[g1, successor]).order_by("pk")]
    assert _dispatch(acme).state == "finalized"
    assert receiver.applied_total() == 1 and receiver.requests[-1]["key"] == third.provider_idempotency_key
    with pytest.raises(RemoteCallEffectOccurred):
        _intent(acme, "i-3")
    assert refused_by("UPDATE effects_remotecallintent SET reason = 'x' WHERE id = %s",
                      [first.pk]) == "effects_remotecallintent_append_only"


@pytest.mark.django_db
def test_the_operator_command_authorizes_and_lists(push_world, receiver):
    """`manage.py remote_call authorize` runs the same admission (a refusal is its stable code, nothing written);
    `remote_call list` shows the root's chain with the intent that authorized each successor. Proves: CV2-09-020"""
    acme = push_world.accounts[0]
    author(acme)
    assert _dispatch(acme).state == "finalized"
    args = ["remote_call", "authorize", acme.account_key, "cli-1", "--root", "order-1", "--slot", SLOT,
            "--reason", "resend", "--principal", "olga", "--body", '{"record_key": "r1"}',
            "--path-params", '{"record_id": "r1", "record_key": "r1"}']
    with pytest.raises(CommandError, match="REMOTE_CALL_EFFECT_OCCURRED"):
        call_command(*args)
    _proven_no_effect(acme, receiver, root="order-2")
    out = io.StringIO()
    call_command(*[a if a != "order-1" else "order-2" for a in args], stdout=out)
    assert "successor intent:cli-1" in out.getvalue()
    assert RemoteCallIntent.objects.get().principal == "operator:olga"
    out = io.StringIO()
    call_command("remote_call", "list", acme.account_key, "order-2", stdout=out)
    lines = [line.split("\t") for line in out.getvalue().splitlines()]
    assert [(line[1], line[4], line[6]) for line in lines] == [("g1", "no_effect", ""),
                                                               ("intent:cli-1", "prepared", "cli-1")]


@pytest.fixture
def tx_push_world(transactional_db):
    return build_push_world()


@pytest.mark.django_db(transaction=True)
def test_two_operators_racing_for_one_root_and_slot_mint_exactly_one_successor(tx_push_world, receiver,
                                                                              monkeypatch):
    """Two operators authorize different intents for the same root and slot at once, each on its own thread and
    connection, after g1 is proven no_effect. The successor author is slowed while it holds the predecessor's
    row lock, so the other admission waits on that lock: exactly one successor generation results; the other
    intent, re-reading the root's effects once it holds the locks, is `resumed` on that successor.
    Proves: CV2-09-020, CV2-09-021, CV2-09-024"""
    acme = tx_push_world.accounts[0]
    g1 = _proven_no_effect(acme, receiver)
    original = intents.outbound.outbound_successor_author

    def slow(**kwargs):
        time.sleep(0.5)
        return original(**kwargs)

    monkeypatch.setattr(intents.outbound, "outbound_successor_author", slow)
    results = run_concurrently([lambda: _intent(acme, "race-a", principal="operator:ann"),
                                lambda: _intent(acme, "race-b", principal="operator:bob")], expect=())
    assert sorted(r.disposition for r in results) == ["resumed", "successor"], results
    minted = OutboundCommand.objects.filter(predecessor=g1)
    assert minted.count() == 1 and OutboundCommand.objects.count() == 2
    winner = next(r for r in results if r.disposition == "successor")
    loser = next(r for r in results if r.disposition == "resumed")
    assert winner.successor_command_id == minted.get().pk
    assert loser.resumed_effect_id == RemoteEffect.objects.get(command=minted.get()).pk
    assert {e["generation"] for e in RemoteCallIntent.objects.get(pk=loser.pk).reconciled} == {"g1",
                                                                                               minted.get().effect_generation_id}


@pytest.mark.django_db
def test_the_governance_effect_page_authorizes_through_the_service_with_the_operator_role(push_world, receiver):
    """On a `no_effect` effect's governance page, an operator (the role, no superuser) sees the form, posts a
    reason with the state token the page showed: the same admission mints one successor repeating the
    predecessor's request (same body and path, re-frozen), attributed to the user; posting the same page again
    returns the same intent. An auditor sees no form and a forged POST is 403; a page shown before the effect
    moved is FENCE_STALE; nothing is written by either. Proves: CV2-09-020, CV2-09-024"""
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from django.urls import reverse

    acme = push_world.accounts[0]
    g1 = _runtime_no_effect(acme, receiver)
    effect = RemoteEffect.objects.get(command=g1)
    clients = {}
    for role in ("auditor", "operator"):
        user = User.objects.create_user(f"{role}-1", password="pw")
        user.groups.add(Group.objects.get(name=role))
        clients[role] = Client()
        clients[role].force_login(user)
    page = reverse("governance:effect", args=[effect.pk])
    url = reverse("governance:effect_remote_call", args=[effect.pk])
    assert url.encode() in clients["operator"].get(page).content
    assert url.encode() not in clients["auditor"].get(page).content
    post = {"reason": "the customer fixed the record; send it again", "changed_at": effect.changed_at.isoformat()}
    assert clients["auditor"].post(url, post).status_code == 403
    stale = clients["operator"].post(url, {**post, "changed_at": "2026-01-01T00:00:00+00:00"}, follow=True)
    assert "FENCE_STALE" in stale.content.decode()
    assert RemoteCallIntent.objects.count() == 0 and OutboundCommand.objects.count() == 1
    for _ in range(2):
        done = clients["operator"].post(url, post, follow=True).content.decode()
        assert "successor generation intent:effect-" in done, done[-3000:]
    intent = RemoteCallIntent.objects.get()
    successor = intent.successor_command
    assert (intent.disposition, intent.principal) == ("successor", "user:operator-1")
    assert successor.predecessor_id == g1.pk and bytes(successor.request_body) == bytes(g1.request_body)
    assert successor.path == g1.path and OutboundCommand.objects.count() == 2
