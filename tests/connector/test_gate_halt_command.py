"""`manage.py gate_halt` (D-401): halt an account's gate and confirm the halt as soon as its open permits settled;
on timeout the gate stays `halting_v2` and the command names the refusal. Real PostgreSQL and a real permit."""
from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from connector.models import AccountServingGate
from effects.services import dispatch
from tests.effects.helpers import ACTOR, author, build_push_world


@pytest.fixture
def world(transactional_db):
    return build_push_world()


def _mode(account) -> str:
    return AccountServingGate.objects.get(account_id=account.pk).mode


def test_gate_halt_waits_for_the_open_permit_and_confirms_after_it_settles(world):
    """A granted permit is open: the command halts, waits, and confirms only after another connection abandons the
    permit (revocation proof); before that the gate is `halting_v2`. Proves: CV2-11-007, CV2-11-008"""
    from tests.effects.helpers import outbound_generation, reenable, revoke

    acme = world.accounts[0]
    author(acme, root="h-1", record_id="h1")
    holder = dispatch.holder_register(holder_id="h-halt")
    permit = dispatch.permit_acquire(claim=dispatch.effect_claim(holder=holder, account_id=acme.pk))
    modes = []

    def settle_later():
        try:
            time.sleep(0.5)
            modes.append(_mode(acme))
            generation = outbound_generation(acme).generation_id
            revoke(generation)
            reenable(generation)
            dispatch.permit_abandon(permit_pk=permit.pk, actor=ACTOR)
        finally:
            connections.close_all()

    out = StringIO()
    other = threading.Thread(target=settle_later)
    other.start()
    call_command("gate_halt", acme.account_key, "--reason", "test: halt and wait", "--timeout", "10", stdout=out)
    other.join()
    assert modes == ["halting_v2"]
    assert _mode(acme) == "v2_halted"
    assert "v2_halted" in out.getvalue() and "settlement notification" in out.getvalue()


def test_gate_halt_times_out_naming_the_refusal_and_leaves_the_gate_halting(world):
    """Nothing settles the open permit: after the timeout the command fails with TRANSITION_REFUSED naming the open
    permit, and the gate stays `halting_v2` (waiting is not a timeout on the halt). Proves: CV2-11-009"""
    acme = world.accounts[0]
    author(acme, root="h-2", record_id="h2")
    holder = dispatch.holder_register(holder_id="h-halt-2")
    dispatch.permit_acquire(claim=dispatch.effect_claim(holder=holder, account_id=acme.pk))
    with pytest.raises(CommandError, match="TRANSITION_REFUSED") as refused:
        call_command("gate_halt", acme.account_key, "--reason", "test", "--timeout", "0.3", stdout=StringIO())
    assert "permit" in str(refused.value)
    assert _mode(acme) == "halting_v2"
    with pytest.raises(CommandError, match="ACCOUNT_NOT_FOUND"):
        call_command("gate_halt", "no-such-account", "--reason", "test", stdout=StringIO())
