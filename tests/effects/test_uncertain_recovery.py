"""The product's own `uncertain -> prepared` under a frozen idempotency contract (issue 37 item 2, D-430..D-436),
against the real loopback receiver: bounded by the contract's repeats and doubling backoff, inside the first half
of the provider's key retention; past either bound the effect waits for a person with a closed reason code, which
a reconciliation lifts. The killed-worker row itself is tests/crash/test_uncertain_recovery_crashes.py."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.db.models import Max

from connector.models import AuditRecord
from effects import tasks
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt
from effects.services import dispatch, recovery, worker
from governance import selectors
from tests.effects.helpers import ACTOR, author

CONTRACT = {"key_header": "Idempotency-Key", "guarantee": "byte_identical_repeat_is_one_effect",
            "retention_seconds": 86400, "automatic_repeats": 2, "repeat_backoff_seconds": 10}


def _world(prefix: str, **contract):
    from connector.demo import build_world

    return build_world(prefix, push=True, idempotency_contract={**CONTRACT, **contract})


def _dispatch(account) -> RemoteEffect:
    return worker.effect_dispatch_once(holder_name="h-worker", account_id=account.pk)


def _at(effect_pk: int, seconds: float):
    """The clock `seconds` after the effect's latest attempt settled (its uncertain outcome)."""
    settled = RemoteEffectAttempt.objects.filter(effect_id=effect_pk).aggregate(at=Max("settled_at"))["at"]
    return mock.patch("django.utils.timezone.now", return_value=settled + timedelta(seconds=seconds))


def _queued(code: str) -> list[int]:
    return [i.pk for i in selectors.queue() if i.kind == "effect" and i.code == code]


def _on_board(code: str) -> list[int]:
    return [i.pk for i in selectors.board().get(code, [])]


def _page(effect_pk: int) -> str:
    """The effect's page as an operator sees it."""
    from django.contrib.auth.models import Group, User
    from django.test import Client

    user = User.objects.filter(username="op-page").first() or User.objects.create_user("op-page", password="pw")
    user.groups.add(Group.objects.get(name="operator"))
    client = Client()
    client.force_login(user)
    return client.get(f"/queue/effect/{effect_pk}/").content.decode()


@pytest.mark.django_db
def test_repeats_back_off_doubling_then_stop_with_uncertain_repeats_spent_until_a_person_reconciles(receiver):
    """A receiver that applies and answers 500 every time: each attempt is `uncertain`. With 2 automatic repeats
    and a 10 s backoff the sweep repeats the effect 10 s after its first uncertain attempt and 20 s after its
    second (not at 15 s), each repeat with the same key (the receiver applies it once); after the third uncertain
    attempt the sweep holds it UNCERTAIN_REPEATS_SPENT (audited `effect_recovery_stopped`): it is in the queue,
    later sweeps write nothing. An operator's `remote_confirmed` lifts the hold and the effect finalizes.
    Proves: issue 37 item 2"""
    acme = _world("rb-").accounts[0]
    key = author(acme).provider_idempotency_key
    receiver.default_mode = "apply_5xx"
    effect = _dispatch(acme)
    assert effect.state == "uncertain"
    assert _on_board("UNCERTAIN_REPEAT_SCHEDULED") == [effect.pk] and _queued("EFFECT_UNCERTAIN") == []
    assert "the product repeats it under the same key at" in _page(effect.pk)
    for backoff in (10, 20):
        with _at(effect.pk, backoff - 5):
            assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 1, "stopped": 0}
        with _at(effect.pk, backoff):
            assert recovery.uncertain_sweep() == {"recovered": 1, "scheduled": 0, "stopped": 0}
        assert RemoteEffect.objects.get(pk=effect.pk).state == "prepared"
        assert _dispatch(acme).state == "uncertain"
    with _at(effect.pk, 3600):
        assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 0, "stopped": 1}
        assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 0, "stopped": 0}
    effect.refresh_from_db()
    assert (effect.state, effect.quarantine_reason) == ("uncertain", "UNCERTAIN_REPEATS_SPENT")
    assert _queued("UNCERTAIN_REPEATS_SPENT") == [effect.pk] and _on_board("UNCERTAIN_REPEAT_SCHEDULED") == []
    assert "stopped: <code>UNCERTAIN_REPEATS_SPENT</code>" in _page(effect.pk)
    assert list(RemoteEffectAttempt.objects.filter(effect=effect).values_list("outcome", flat=True)) == [
        "uncertain"] * 3
    assert [r["key"] for r in receiver.requests] == [key] * 3 and receiver.applied == {key: 1}
    actions = list(AuditRecord.objects.filter(entity_type="effects.RemoteEffect", entity_id=str(effect.pk))
                   .values_list("action", flat=True).order_by("pk"))
    assert actions.count("effect_recover_idempotent_repeat") == 2 and actions[-1] == "effect_recovery_stopped"

    confirmed = dispatch.effect_reconcile(effect_pk=effect.pk, decision="remote_confirmed", actor=ACTOR,
                                          evidence="provider console: record applied once under the key",
                                          expected_changed_at=effect.changed_at, remote_id="remote-" + key[-12:])
    assert (confirmed.state, confirmed.quarantine_reason) == ("remote_confirmed", "")
    assert worker.effects_sweep()["finalized"] == 1
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert _queued("UNCERTAIN_REPEATS_SPENT") == []


@pytest.mark.django_db
def test_a_repeat_past_half_the_key_retention_waits_with_uncertain_key_retention_passed(receiver):
    """A provider that keeps keys 120 s: a repeat is made only within the first 60 s after the first send. When the
    sweep first finds the effect later than that, it holds it UNCERTAIN_KEY_RETENTION_PASSED (the provider may have
    forgotten the key, so a repeat is no longer provably one effect); nothing is sent again. An operator's
    `no_effect` (with proof) lifts the hold and the frozen policy's next attempt follows.
    Proves: issue 37 item 2"""
    acme = _world("rr-", retention_seconds=120).accounts[0]
    author(acme)
    receiver.default_mode = "apply_5xx"
    effect = _dispatch(acme)
    first_sent = DispatchPermit.objects.get(effect=effect).sending_at
    with mock.patch("django.utils.timezone.now", return_value=first_sent + timedelta(seconds=61)):
        assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 0, "stopped": 1}
    effect.refresh_from_db()
    assert (effect.state, effect.quarantine_reason) == ("uncertain", "UNCERTAIN_KEY_RETENTION_PASSED")
    assert _queued("UNCERTAIN_KEY_RETENTION_PASSED") == [effect.pk]
    assert len(receiver.requests) == 1
    back = dispatch.effect_reconcile(effect_pk=effect.pk, decision="no_effect", actor=ACTOR,
                                     evidence="provider console: no record under the key",
                                     expected_changed_at=effect.changed_at)
    assert (back.state, back.quarantine_reason) == ("prepared", "")
    assert _queued("UNCERTAIN_KEY_RETENTION_PASSED") == []


@pytest.mark.django_db
def test_a_sweep_that_read_an_older_state_writes_nothing(receiver):
    """The state token: `uncertain_recover` with a `changed_at` other than the effect's current one (an operator
    decided meanwhile) writes nothing and returns None.
    Proves: issue 37 item 2"""
    acme = _world("rt-").accounts[0]
    author(acme)
    receiver.default_mode = "apply_5xx"
    effect = _dispatch(acme)
    with _at(effect.pk, 60):
        assert recovery.uncertain_recover(effect_pk=effect.pk, account_id=acme.pk,
                                          expected_changed_at=effect.changed_at - timedelta(seconds=1)) is None
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"
    assert not AuditRecord.objects.filter(action__startswith="effect_recover").exists()


@pytest.mark.parametrize("declared", [
    None,
    "yes",
    {**CONTRACT, "key_header": "X-Request-Id"},  # the adapter sends the key as Idempotency-Key only
    {**CONTRACT, "guarantee": "best_effort"},
    {k: v for k, v in CONTRACT.items() if k != "retention_seconds"},
    {**CONTRACT, "retention_seconds": 59},
    {**CONTRACT, "retention_seconds": "86400"},
    {**CONTRACT, "automatic_repeats": 11},
    {**CONTRACT, "repeat_backoff_seconds": 0},
    {**CONTRACT, "unknown": 1},
])
def test_a_contract_that_does_not_prove_the_repeat_safe_is_no_contract(declared):
    """Fail closed: a missing, malformed or weaker declaration is no proof (the effect waits for a person).
    Proves: issue 37 item 2"""
    assert recovery.declared_idempotency_contract({"idempotency_contract": declared}) is None


def test_a_declared_contract_completes_its_defaults():
    """Proves: issue 37 item 2"""
    minimal = {k: CONTRACT[k] for k in ("key_header", "guarantee", "retention_seconds")}
    assert recovery.declared_idempotency_contract({"idempotency_contract": minimal}) == (
        recovery.IdempotencyContract(retention_seconds=86400, automatic_repeats=3, repeat_backoff_seconds=30))


def test_the_uncertain_sweep_runs_on_its_own_beat_and_wakes_the_egress_when_it_recovered():
    """The work is found in PostgreSQL by a beat of its own; a broker message only wakes the egress afterwards.
    Proves: issue 37 item 2"""
    assert settings.CELERY_BEAT_SCHEDULE["sweeper-uncertain"]["task"] == "effects.tasks.uncertain_sweep"
    with mock.patch.object(recovery, "uncertain_sweep", return_value={"recovered": 2, "scheduled": 0, "stopped": 0}), \
            mock.patch.object(tasks.effect_dispatch, "delay") as wake:
        assert tasks.uncertain_sweep()["recovered"] == 2
    wake.assert_called_once_with()
    with mock.patch.object(recovery, "uncertain_sweep", return_value={"recovered": 0, "scheduled": 1, "stopped": 0}), \
            mock.patch.object(tasks.effect_dispatch, "delay") as wake:
        tasks.uncertain_sweep()
    wake.assert_not_called()


def test_make_run_s_demo_callout_declares_a_contract_that_proves_the_repeat():
    """`manage.py demo_load` (make run) builds its world with the demo CRM's contract: it must be one the recovery
    accepts, or make run's killed-worker effects would wait for a person again.
    Proves: issue 37 item 2"""
    from connector import demo

    declared = {**demo.CALLOUT_DEFINITION, "idempotency_contract": demo.CALLOUT_IDEMPOTENCY_CONTRACT}
    assert recovery.declared_idempotency_contract(declared) == recovery.IdempotencyContract(86400, 3, 15)
