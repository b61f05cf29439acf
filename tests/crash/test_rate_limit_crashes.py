"""Crash rule of a rate-limited destination (D-222), with a real process kill: a worker SIGKILLed at
"egress.after_sending" holds its destination's in-flight slot (its permit is `sending`) until holder isolation
abandons the permit. Time never frees the slot, and nothing is sent twice or lost (the receiver's counts)."""
from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from effects.choices import EffectState, PermitState
from effects.models import DestinationLimiter, DispatchPermit, RemoteEffect
from effects.services import dispatch
from effects.services.worker import effect_dispatch_once
from tests.crash.support import DB, assert_killed
from tests.crash.test_outbound_crashes import (  # noqa: F401 - the receiver and child_env fixtures
    DEAD,
    DISPATCH_SCRIPT,
    OPERATOR,
    RECOVERY,
    _terminate_dead_holder,
    child_env,
    receiver,
)
from tests.effects.helpers import author


@pytest.mark.django_db(**DB)
def test_crash_while_sending_holds_the_destination_slot_until_holder_isolation(run_child, receiver, monkeypatch):
    """A destination declared with 1 in flight: the worker dies at "egress.after_sending" (permit `sending`
    committed, no byte sent). A day later the destination's other effect is still not claimable (its one slot is
    held by the open permit; elapsed time proves nothing). After holder isolation the permit is abandoned
    (effect `uncertain`, never retried automatically), the slot is free, and the other effect is sent exactly
    once. The receiver never saw the crashed effect. Proves: CV2-10-049, CV2-10-040, CV2-10-037"""
    from connector import demo

    monkeypatch.setattr(demo, "CALLOUT_DEFINITION", {**demo.CALLOUT_DEFINITION,
                                                     "rate_limit": {"requests_per_second": 100, "max_in_flight": 1}})
    account = demo.build_world("o-", push=True).accounts[0]
    crashed, other = author(account, root="o-1", record_id="o1"), author(account, root="o-2", record_id="o2")
    run = run_child(DISPATCH_SCRIPT, "egress.after_sending", account_id=account.pk, holder=DEAD)
    assert_killed(run)
    permit = DispatchPermit.objects.get(effect__command=crashed)
    assert (permit.state, permit.limiter_id) == (PermitState.SENDING, crashed.limiter_id)
    assert receiver.requests == []

    recovery = dispatch.holder_register(holder_id=RECOVERY)
    with mock.patch("django.utils.timezone.now", return_value=timezone.now() + timedelta(days=1)):
        assert dispatch.effect_claim(holder=recovery, account_id=account.pk) is None
    assert effect_dispatch_once(holder_name=RECOVERY, account_id=account.pk) is None
    assert RemoteEffect.objects.get(command=other).attempt_count == 0 and receiver.requests == []

    _terminate_dead_holder(run)
    assert dispatch.permit_abandon(permit_pk=permit.pk, actor=OPERATOR).state == EffectState.UNCERTAIN
    done = effect_dispatch_once(holder_name=RECOVERY, account_id=account.pk)
    assert (done.command_id, done.state) == (other.pk, EffectState.FINALIZED)
    assert effect_dispatch_once(holder_name=RECOVERY, account_id=account.pk) is None  # uncertain: an operator's
    assert RemoteEffect.objects.get(command=crashed).state == EffectState.UNCERTAIN
    assert [r["key"] for r in receiver.requests] == [other.provider_idempotency_key]
    assert receiver.applied == {other.provider_idempotency_key: 1}
    assert DestinationLimiter.objects.get().granted_total == 2
