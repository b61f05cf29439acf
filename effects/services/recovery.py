"""The product's own `uncertain -> prepared` under a frozen provider idempotency contract (issue 37 item 2,
D-430..D-436).

The seed allows `uncertain -> prepared` "with a frozen provider idempotency contract proving that the
byte-identical request and idempotency key cannot create a second logical effect"; the prior Attempt stays
immutably `uncertain` and the new Attempt reuses the same key (CV2-10-026, CV2-10-029, CV2-10-051). The proof is a
fact of the frozen binding, never of the moment:

- the command froze a provider idempotency key (its push contract declares `"idempotency": "provider_key"`), which
  the sole egress adapter sends as `Idempotency-Key` with the command's frozen method, path and body;
- the command's frozen callout profile (the exact epoch's binding) declares an `idempotency_contract`: the
  provider's promise that a repeat of the byte-identical request under the same key within `retention_seconds`
  creates no second effect (`declared_idempotency_contract`);
- every Attempt of the effect carried exactly the command's request digest and key;
- the repeat is due within the first half of the key's retention, counted from the first `sending` marker.

Bounded by the contract's policy: at most `automatic_repeats` repeats (the effect's uncertain Attempts beyond the
first), each after `repeat_backoff_seconds` doubled per uncertain Attempt. When the bound or the window is spent
the effect stays `uncertain` and waits for a person with a closed reason code (UNCERTAIN_REPEATS_SPENT,
UNCERTAIN_KEY_RETENTION_PASSED) held on the effect, exactly as before this change for an effect without the proof
(EFFECT_UNCERTAIN). Work is found in PostgreSQL by `uncertain_sweep` (the `sweeper-uncertain` beat); each effect
moves in `uncertain_recover`'s own transaction (guard, effect FOR UPDATE, state token, audit)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import transaction
from django.db.models import Min, Q
from django.utils import timezone

from connector.actors import Actor
from connector.services import poison
from connector.services.audit import audit_record
from connector.services.guard import lock_serving
from effects import locks
from effects.choices import UNCERTAIN_HOLDS, AttemptOutcome, EffectState
from effects.errors import OutboundRefused
from effects.models import DispatchPermit, OutboundCommand, RemoteEffect, RemoteEffectAttempt
from effects.services.outbound import frozen_binding
from effects.services.poison import effect_quarantine

log = logging.getLogger(__name__)
RECOVERER = Actor.system("uncertain-recovery")
STEP = "uncertain_recover"

KEY_HEADER = "Idempotency-Key"  # the header the egress adapter sends the frozen provider key in
GUARANTEE = "byte_identical_repeat_is_one_effect"
CONTRACT_FIELDS = {"key_header", "guarantee", "retention_seconds", "automatic_repeats", "repeat_backoff_seconds"}
RETENTION_RANGE = (60, 400 * 86400)
REPEATS_MAX = 10
BACKOFF_RANGE = (1, 86400)


@dataclass(frozen=True)
class IdempotencyContract:
    retention_seconds: int
    automatic_repeats: int = 3
    repeat_backoff_seconds: int = 30


def declared_idempotency_contract(callout_def: dict) -> IdempotencyContract | None:
    """The callout definition's `idempotency_contract`, or None when it declares none or declares one that does not
    prove the repeat safe (wrong header or guarantee, a missing or out-of-range number): fail closed, the effect
    then waits for a person as without a contract. See docs/delivery.md "Uncertain effects"."""
    declared = callout_def.get("idempotency_contract")
    if not isinstance(declared, dict) or not set(declared) <= CONTRACT_FIELDS:
        return None
    if declared.get("key_header") != KEY_HEADER or declared.get("guarantee") != GUARANTEE:
        return None
    values = {"retention_seconds": declared.get("retention_seconds"),
              "automatic_repeats": declared.get("automatic_repeats", 3),
              "repeat_backoff_seconds": declared.get("repeat_backoff_seconds", 30)}
    ranges = {"retention_seconds": RETENTION_RANGE, "automatic_repeats": (0, REPEATS_MAX),
              "repeat_backoff_seconds": BACKOFF_RANGE}
    for name, value in values.items():
        low, high = ranges[name]
        if type(value) is not int or not low <= value <= high:
            return None
    return IdempotencyContract(**values)


def command_contract(*, epoch_pk: int, epoch_digest: bytes, callout: str) -> IdempotencyContract | None:
    """The contract of a command's frozen callout profile (its exact epoch's binding, read once per process)."""
    try:
        binding = frozen_binding(epoch_pk=epoch_pk, epoch_digest=bytes(epoch_digest), kind="callout_profile",
                                 business_key=callout)
    except OutboundRefused:
        return None
    return declared_idempotency_contract(binding.definition())


# -- the outlook of one uncertain effect -----------------------------------------------------------------------

NO_PROOF, SCHEDULED, DUE, STOPPED = "no_proof", "scheduled", "due", "stopped"


@dataclass(frozen=True)
class Outlook:
    kind: str  # NO_PROOF (waits for a person: EFFECT_UNCERTAIN), SCHEDULED, DUE, STOPPED (a hold code)
    detail: str
    due_at: datetime | None = None
    code: str = ""  # STOPPED: UNCERTAIN_REPEATS_SPENT or UNCERTAIN_KEY_RETENTION_PASSED


def recovery_outlook(effect: RemoteEffect, command: OutboundCommand, *, now: datetime) -> Outlook:
    """What the product does with an `uncertain` effect (read-only; the effect's immutable Attempts and permits
    and its command's frozen binding decide it, the module docstring's rules)."""
    key = command.provider_idempotency_key
    if not key:
        return Outlook(NO_PROOF, "the push contract froze no provider idempotency key")
    contract = command_contract(epoch_pk=command.epoch_id, epoch_digest=command.epoch_digest,
                                callout=command.callout)
    if contract is None:
        return Outlook(NO_PROOF, f"the frozen callout profile {command.callout!r} declares no idempotency contract")
    attempts = list(RemoteEffectAttempt.objects.filter(effect_id=effect.pk).order_by("ordinal").values_list(
        "ordinal", "request_digest", "provider_idempotency_key", "outcome", "settled_at"))
    for ordinal, digest, attempt_key, _outcome, _settled in attempts:
        if bytes(digest) != bytes(command.request_digest) or attempt_key != key:
            return Outlook(NO_PROOF, f"attempt {ordinal} carried another request or key than the frozen command")
    uncertain = [(ordinal, settled) for ordinal, _d, _k, outcome, settled in attempts
                 if outcome == AttemptOutcome.UNCERTAIN]
    if not uncertain:  # pragma: no cover - an uncertain effect always has its uncertain attempt
        return Outlook(NO_PROOF, "no uncertain attempt")
    first_sent = DispatchPermit.objects.filter(effect_id=effect.pk, io_may_have_started=True).aggregate(
        at=Min("sending_at"))["at"] or min(s for _o, s in uncertain)
    window_end = first_sent + timedelta(seconds=contract.retention_seconds / 2)
    repeats = len(uncertain) - 1
    proof = (f"frozen idempotency contract of callout {command.callout!r}: the byte-identical request under key "
             f"{key} creates one effect within {contract.retention_seconds} s of the first send "
             f"({first_sent:%Y-%m-%dT%H:%M:%SZ})")
    if repeats >= contract.automatic_repeats:
        return Outlook(STOPPED, f"{repeats} automatic repeat(s) spent of {contract.automatic_repeats}; "
                                f"attempt {uncertain[-1][0]} is uncertain too", code="UNCERTAIN_REPEATS_SPENT")
    due_at = uncertain[-1][1] + timedelta(seconds=contract.repeat_backoff_seconds * 2 ** repeats)
    if max(due_at, now) > window_end:
        return Outlook(STOPPED, f"a repeat at {max(due_at, now):%Y-%m-%dT%H:%M:%SZ} would fall outside the first half "
                                f"of the key's retention (until {window_end:%Y-%m-%dT%H:%M:%SZ})",
                       code="UNCERTAIN_KEY_RETENTION_PASSED")
    detail = f"automatic repeat {repeats + 1} of {contract.automatic_repeats}; {proof}"
    return Outlook(DUE if now >= due_at else SCHEDULED, detail, due_at=due_at)


# -- the service -----------------------------------------------------------------------------------------------

def uncertain_recover(*, effect_pk: int, account_id: int, expected_changed_at: datetime) -> Outlook | None:
    """One uncertain effect, in one transaction: the account's serving guard (gate `v2_serving`, exact active
    epoch, FOR SHARE), the effect FOR UPDATE, the state token (`changed_at` as the sweep read it; the effect must
    still be `uncertain` and not held), then its outlook: DUE takes `uncertain -> prepared` (the prior Attempts
    untouched; the next claim appends a new Attempt with the same frozen request and key), STOPPED holds it with
    its reason code for a person; each with an audit row. None (nothing written) when the effect moved; the
    outlook otherwise. GateNotServing / FenceStale propagate (nothing written)."""
    with transaction.atomic():
        lock_serving(account_id=account_id)
        effect = locks.effect_for_update(effect_pk, account_id=account_id)
        if (effect is None or effect.state != EffectState.UNCERTAIN or effect.quarantine_reason
                or effect.changed_at != expected_changed_at):
            return None
        command = OutboundCommand.objects.get(pk=effect.command_id, account_id=account_id)
        now = timezone.now()
        outlook = recovery_outlook(effect, command, now=now)
        if outlook.kind == DUE:
            effect.retry()
            effect.save()
            audit_record(actor=RECOVERER, entity=effect, action="effect_recover_idempotent_repeat",
                         from_state=EffectState.UNCERTAIN, to_state=effect.state, reason=outlook.detail[:500])
        elif outlook.kind == STOPPED:
            RemoteEffect.objects.filter(pk=effect.pk).update(quarantine_reason=outlook.code, changed_at=now)
            audit_record(actor=RECOVERER, entity=effect, action="effect_recovery_stopped",
                         from_state=EffectState.UNCERTAIN, to_state=EffectState.UNCERTAIN,
                         reason=f"{outlook.code}: {outlook.detail}"[:500])
        return outlook


def uncertain_sweep(*, limit: int = 200) -> dict[str, int]:
    """Due recovery work from PostgreSQL (the `sweeper-uncertain` beat; Redis only wakes the egress afterwards):
    uncertain effects not held, with a frozen provider key, whose command's (epoch, callout) declares a contract,
    oldest first. Each one's outlook is read without a lock; only a DUE or STOPPED one goes through
    `uncertain_recover` (which decides again under its locks), isolated (D-168: a deterministic failure holds that
    effect with EFFECT_STEP_FAILED, a transient one or a gate not serving leaves it for the next sweep). A
    scheduled effect is only read; an effect without the proof is never read past the pair query, never written:
    it waits for a person as EFFECT_UNCERTAIN."""
    base = RemoteEffect.objects.filter(state=EffectState.UNCERTAIN, quarantine_reason="",
                                       command__provider_idempotency_key__isnull=False)
    pairs = set(base.order_by().values_list("command__epoch_id", "command__epoch_digest", "command__callout")
                .distinct())
    proven = [(epoch_pk, callout) for epoch_pk, digest, callout in pairs
              if command_contract(epoch_pk=epoch_pk, epoch_digest=digest, callout=callout) is not None]
    report = {"recovered": 0, "scheduled": 0, "stopped": 0}
    if not proven:
        return report
    which = Q()
    for epoch_pk, callout in proven:
        which |= Q(command__epoch_id=epoch_pk, command__callout=callout)
    counted = {DUE: "recovered", STOPPED: "stopped"}
    for effect in base.filter(which).select_related("command").order_by("changed_at", "pk")[:limit]:
        # A gate not serving (halt, succession) is transient: the effect waits for the next sweep, unwritten.
        with poison.isolated(step=STEP, item=f"effect {effect.pk}",
                             quarantine=partial(effect_quarantine, effect_pk=effect.pk, step=STEP)):
            if recovery_outlook(effect, effect.command, now=timezone.now()).kind == SCHEDULED:
                report["scheduled"] += 1
                continue
            outlook = uncertain_recover(effect_pk=effect.pk, account_id=effect.account_id,
                                        expected_changed_at=effect.changed_at)
            if outlook is not None and outlook.kind in counted:
                report[counted[outlook.kind]] += 1
            elif outlook is not None and outlook.kind == SCHEDULED:  # pragma: no cover - a clock step back
                report["scheduled"] += 1
    return report


def effect_recovery_outlook(effect: RemoteEffect) -> Outlook | None:
    """The outlook of an `uncertain` effect for the operator screens (None for any other state); a held effect
    shows its hold code."""
    if effect.state != EffectState.UNCERTAIN:
        return None
    if effect.quarantine_reason in UNCERTAIN_HOLDS:
        return Outlook(STOPPED, "automatic recovery stopped", code=effect.quarantine_reason)
    return recovery_outlook(effect, effect.command, now=timezone.now())
