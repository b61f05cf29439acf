"""Issue 37's row "worker SIGKILL mid-burst", with a real process kill: a child process runs the batched egress
step (`effect_dispatch_batch`, the worker's production step) over three effects of one account and dies by SIGKILL
at "dispatch.batch_settle_before_commit" — the receiver applied all three, no settlement committed. The supervisor
isolates the dead generation and abandons its `sending` permits (`manage.py holders terminate --abandon`): the
three effects are `uncertain` (the seed's crash row "Worker may have completed external I/O but lacks proof").

- The callout profile froze an idempotency contract (the provider applies a byte-identical request under one key
  once): the sweeper (`effects.services.recovery.uncertain_sweep`, the `sweeper-uncertain` beat) takes
  `uncertain -> prepared` itself once the backoff passed, a new worker process re-sends each request with the same
  key and finalizes it; the receiver counts ONE application per key; no person decided anything.
- The callout profile froze no such contract: the effects stay `uncertain` and wait for a person (EFFECT_UNCERTAIN
  in the queue), however much time passes; nothing is sent again.
"""
from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.db.models import Min
from django.utils import timezone

from connector.actors import Actor
from connector.models import AuditRecord
from effects.choices import PERMIT_OPEN, AttemptOutcome, EffectState, PermitState
from effects.models import DispatchPermit, RemoteEffect, RemoteEffectAttempt, RemoteLink
from effects.services import dispatch, recovery
from governance import selectors
from tests.crash import egress_fixtures
from tests.crash.support import DB, assert_killed
from tests.effects.helpers import author

SUPERVISOR = Actor.system("supervisor")
DEAD = "ur-crash-child"
RECOVERY = "ur-recovery"
CONTRACT = {"key_header": "Idempotency-Key", "guarantee": "byte_identical_repeat_is_one_effect",
            "retention_seconds": 86400, "automatic_repeats": 3, "repeat_backoff_seconds": 1}

BATCH_SCRIPT = """
from effects.services.worker import effect_dispatch_batch
done = effect_dispatch_batch(n=10, holder_name=ARGS["holder"], account_id=ARGS["account_id"])
emit(effects=[e.pk for e in done], states=[e.state for e in done])
"""

receiver = egress_fixtures.receiver  # the receiver, and the child's environment pointed at it
child_env = egress_fixtures.child_env


def _crash_mid_burst(run_child, receiver, prefix: str, contract) -> tuple[int, list[RemoteEffect], list[str]]:
    """Three effects; the worker process dies after the receiver applied all three, before their settlement
    committed; the supervisor then isolates it and abandons its permits: three `uncertain` effects."""
    from connector.demo import build_world

    account = build_world(prefix, push=True, idempotency_contract=contract).accounts[0]
    effects = [RemoteEffect.objects.select_related("command").get(
        command=author(account, root=f"order-{i}", record_id=f"r{i}")) for i in range(3)]
    keys = [e.command.provider_idempotency_key for e in effects]
    assert all(keys)
    run = run_child(BATCH_SCRIPT, "dispatch.batch_settle_before_commit", account_id=account.pk, holder=DEAD)
    assert_killed(run)
    assert receiver.applied == {key: 1 for key in keys} and len(receiver.requests) == 3
    assert set(DispatchPermit.objects.values_list("state", flat=True)) == {PermitState.SENDING}
    dispatch.holder_terminate(holder_id=DEAD, actor=SUPERVISOR,
                              evidence=f"supervisor: worker process exited by signal (returncode {run.returncode}); "
                                       "egress revoked")
    for permit in DispatchPermit.objects.filter(state__in=PERMIT_OPEN).order_by("pk"):
        assert dispatch.permit_abandon(permit_pk=permit.pk, actor=SUPERVISOR).state == EffectState.UNCERTAIN
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {EffectState.UNCERTAIN}
    return account.pk, effects, keys


def _effect_items(code: str | None = None, *, queue: bool) -> list:
    items = selectors.queue() if queue else [i for group in selectors.board().values() for i in group]
    return sorted(i.pk for i in items if i.kind == "effect" and (code is None or i.code == code))


@pytest.mark.django_db(**DB)
def test_killed_worker_effects_with_an_idempotency_contract_are_repeated_and_finalized_without_a_person(
        run_child, receiver):
    """Issue 37's row "worker SIGKILL mid-burst" under a frozen idempotency contract: after the kill and the
    supervisor's isolation the three effects are `uncertain` and on the board as UNCERTAIN_REPEAT_SCHEDULED, not in
    the queue (no person is needed). Before the backoff passed the sweep writes nothing; once due, the sweep takes
    `uncertain -> prepared` for each (audited `effect_recover_idempotent_repeat`), a new worker process sends each
    byte-identical request again under the same key, and every effect is `finalized` with its RemoteLink: two
    requests per key at the receiver, ONE application each (0 duplicated, 0 lost). Attempt 1 of each stays
    `uncertain` with its evidence untouched; Attempt 2 carries the same request digest and key. No reconciliation
    was made.
    Proves: issue 37 item 2"""
    account_id, effects, keys = _crash_mid_burst(run_child, receiver, "ur-", CONTRACT)
    pks = sorted(e.pk for e in effects)
    first = {a.effect_id: (a.evidence, a.outcome) for a in RemoteEffectAttempt.objects.all()}
    assert _effect_items(queue=True) == []
    assert _effect_items("UNCERTAIN_REPEAT_SCHEDULED", queue=False) == pks

    abandoned = RemoteEffectAttempt.objects.aggregate(at=Min("settled_at"))["at"]
    before_due = abandoned + timedelta(seconds=0.5)  # the backoff (1 s after the abandonment) has not passed
    with mock.patch("django.utils.timezone.now", return_value=before_due):
        assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 3, "stopped": 0}
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {EffectState.UNCERTAIN}

    deadline = time.monotonic() + 30  # await the condition: the backoff passes in about a second
    recovered = 0
    while recovered < 3 and time.monotonic() < deadline:
        recovered += recovery.uncertain_sweep()["recovered"]
        time.sleep(0.2)
    assert recovered == 3
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {EffectState.PREPARED}
    assert len(receiver.requests) == 3  # the recovery itself sends nothing

    run = run_child(BATCH_SCRIPT, account_id=account_id, holder=RECOVERY)  # a new worker process
    assert run.returncode == 0, run.stderr
    assert sorted(run.result()["effects"]) == pks

    for e in effects:
        e.refresh_from_db()
        assert e.state == EffectState.FINALIZED and not e.quarantine_reason
        a1, a2 = RemoteEffectAttempt.objects.filter(effect=e).order_by("ordinal")
        assert (a1.outcome, a1.evidence) == (AttemptOutcome.UNCERTAIN, first[e.pk][0])  # never rewritten
        assert a2.outcome == AttemptOutcome.REMOTE_CONFIRMED and a2.holder.holder_id == RECOVERY
        assert bytes(a2.request_digest) == bytes(a1.request_digest) == bytes(e.command.request_digest)
        assert a2.provider_idempotency_key == a1.provider_idempotency_key == e.command.provider_idempotency_key
        actions = list(AuditRecord.objects.filter(entity_type="effects.RemoteEffect", entity_id=str(e.pk))
                       .order_by("pk").values_list("action", "actor"))
        assert actions[0] == ("effect_recover_idempotent_repeat", str(recovery.RECOVERER))
        assert not any(action.startswith("effect_reconcile") for action, _ in actions)
    assert RemoteLink.objects.filter(effect__in=effects, state="active").count() == 3
    assert sorted(r["key"] for r in receiver.requests) == sorted(keys * 2)
    assert receiver.applied == {key: 1 for key in keys}  # one logical effect per key
    assert not DispatchPermit.objects.filter(state__in=PERMIT_OPEN).exists()
    assert _effect_items(queue=False) == []


@pytest.mark.django_db(**DB)
def test_killed_worker_effects_without_an_idempotency_contract_wait_for_a_person(run_child, receiver):
    """The same kill, the callout profile froze no idempotency contract (the push contract still sends a key, but
    nothing proves the provider dedupes by it): the three effects stay `uncertain` and wait for a person as
    EFFECT_UNCERTAIN in the queue. A day later the sweep still writes nothing and nothing is sent again.
    Proves: issue 37 item 2"""
    account_id, effects, keys = _crash_mid_burst(run_child, receiver, "un-", False)
    pks = sorted(e.pk for e in effects)
    assert _effect_items("EFFECT_UNCERTAIN", queue=True) == pks
    effect_audits = AuditRecord.objects.filter(entity_type="effects.RemoteEffect")
    audits = effect_audits.count()
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(days=1)):
        assert recovery.uncertain_sweep() == {"recovered": 0, "scheduled": 0, "stopped": 0}
    run = run_child(BATCH_SCRIPT, account_id=account_id, holder=RECOVERY)
    assert run.returncode == 0, run.stderr
    assert run.result()["effects"] == []
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {EffectState.UNCERTAIN}
    assert effect_audits.count() == audits
    assert len(receiver.requests) == 3 and receiver.applied == {key: 1 for key in keys}
    assert _effect_items("EFFECT_UNCERTAIN", queue=True) == pks
