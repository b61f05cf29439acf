"""`halting_v2 -> v2_halted` as soon as the gate's last open permit settled (issue 20, goal 5; D-380..D-382).

`wait_halted` is `gate_transition(action="confirm_halted")` for a caller that wants to wait for the drain instead
of retrying the refusal: it LISTENs on `hooks.HALT_DRAIN_CHANNEL`, on which the transaction that closes a permit
of a `halting_v2` gate NOTIFYs that gate's pk at its commit (effects migration 0016), reads the gate's halt
blockers without a lock when woken (or every `poll_seconds` if no notification came: a lost one only costs the
poll), and only when they read empty runs the confirm transaction, which takes the gate's advisory lock and
`FOR UPDATE` and re-reads the open-permit set under them (CV2-11-007): the unlocked read is a hint that saves
the locked transaction while permits are open, never the check. A notification marked `clear` (the closing
statement saw no other open permit of the gate) skips that read (D-384): it too is only a hint. In `halting_v2` no permit can be granted (the
guard refuses acquisition), so an empty read stays empty until the transition.

Waiting is not a timeout on the halt (CV2-11-009): when `timeout` passes, the waiter raises the refusal
`gate_transition` gives and the gate stays `halting_v2`; nothing is cancelled or abandoned.
"""
from __future__ import annotations

import time

from django.db import connection

from connector import hooks
from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import TransitionRefused
from connector.models import AccountServingGate
from connector.services.gates import gate_transition


def wait_halted(*, account_id: int, actor: Actor, reason: str = "", expected_fence: int | None = None,
                timeout: float = 30.0, poll_seconds: float = 0.1) -> dict:
    """Confirm `halting_v2 -> v2_halted` for the account's gate once its open-permit set is empty; returns
    {"gate": the gate, "attempts": confirm transactions run, "wakeups": notifications received, "woken_at": the
    wall-clock time the last one arrived (None if none did)}. Raises what
    `gate_transition` raises: immediately when the gate is not `halting_v2` (or the fence is stale), and, still
    blocked by an open permit after `timeout` seconds, its last refusal. Must run outside a transaction (LISTEN
    takes effect at once only in autocommit, and each confirm is its own transaction)."""
    if connection.in_atomic_block:
        raise TransitionRefused("wait_halted runs outside a transaction: each confirm attempt is its own")

    def confirm() -> AccountServingGate:
        return gate_transition(account_id=account_id, action="confirm_halted", expected_fence=expected_fence,
                               actor=actor, reason=reason)

    gate = AccountServingGate.objects.get(account_id=account_id)  # unlocked: the pk and mode, as a hint
    if gate.mode != GateMode.HALTING_V2:
        return {"gate": confirm(), "attempts": 1, "wakeups": 0, "woken_at": None}  # the refusal (or success) gate_transition gives
    deadline = time.monotonic() + timeout
    attempts = wakeups = 0
    woken_at = None
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {hooks.HALT_DRAIN_CHANNEL}")
    clear = False  # the last notification said no open permit was visible to the settlement (D-384)
    try:
        while True:
            # Listening before this read: a permit closed after it notifies; one closed before it is read here.
            if clear or not hooks.halt_blockers(gate):
                attempts += 1
                try:
                    return {"gate": confirm(), "attempts": attempts, "wakeups": wakeups, "woken_at": woken_at}
                except TransitionRefused:
                    clear = False
                    current = AccountServingGate.objects.get(pk=gate.pk)
                    if current.mode != GateMode.HALTING_V2 or time.monotonic() >= deadline:
                        raise
            elif time.monotonic() >= deadline:
                attempts += 1
                # Still blocked at the deadline: the confirm raises the refusal (the gate stays halting_v2).
                return {"gate": confirm(), "attempts": attempts, "wakeups": wakeups, "woken_at": woken_at}
            got = _wait_for(gate.pk, min(poll_seconds, max(0.0, deadline - time.monotonic())))
            clear = got == 2
            if got:
                wakeups, woken_at = wakeups + 1, time.time()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"UNLISTEN {hooks.HALT_DRAIN_CHANNEL}")
        _wait_for(gate.pk, 0.0)  # drop what arrived meanwhile: the connection is reused


def _wait_for(gate_pk: int, seconds: float) -> int:
    """Wait up to `seconds` for a notification naming `gate_pk` (others are dropped): 0 if none came, 1 if one
    came, 2 if the last one taken said `clear` (no open permit visible to the closing statement). Notifications
    come in commit order; all those already received are taken at once."""
    raw = connection.connection
    until = time.monotonic() + seconds
    ours = (str(gate_pk), f"{gate_pk}:clear")
    while True:
        got = 0
        for notify in raw.notifies(timeout=max(0.0, until - time.monotonic()), stop_after=1):
            if notify.channel == hooks.HALT_DRAIN_CHANNEL and notify.payload in ours:
                got = 2 if notify.payload == ours[1] else 1
        if got:
            return got
        if time.monotonic() >= until:
            return 0
