"""The serving guard: the one check every production V2 write passes (admission, replay, materialization,
claims, outbound authoring, permit acquisition). CV2-03-015/016/017/021/022.

Lock order is epoch before gate (activation locks epochs first): read which epoch the gate names, lock that
epoch FOR SHARE, lock the gate FOR SHARE, and re-check the gate still names that epoch (retry once if not).
Share locks let writes of one account proceed together while still serializing with every gate or epoch
transition, which takes FOR UPDATE.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from connector import locks
from connector.choices import EpochState, GateMode
from connector.errors import FenceStale, GateNotServing
from connector.models import AccountServingGate


@dataclass(frozen=True)
class ServingContext:
    """What a guarded write binds its facts to: the exact gate fence and epoch it was admitted under."""

    account_id: int
    gate_pk: int
    fence: int
    epoch_pk: int
    epoch_id: str
    epoch_digest: bytes


def _named_epoch(account_id: int) -> int | None:
    return AccountServingGate.objects.filter(account_id=account_id).values_list("epoch_id", flat=True).first()


def lock_serving(*, account_id: int, epoch_id: str | None = None, epoch_digest: bytes | None = None,
                 expected_fence: int | None = None, settling: bool = False) -> ServingContext:
    """Lock and check the gate and its exact epoch inside the caller's transaction.

    Requires: gate `v2_serving`; `expected_fence` (if the caller acts on an observed fence) equal to the
    current fence; the gate's epoch ID and digest equal to the epoch row's and to the caller's (if given); the
    epoch `active`. Raises GateNotServing or FenceStale otherwise; the caller's transaction then writes nothing.

    `settling=True` is for recording the outcome of already-claimed work (a Runtime result receipt), which the
    seed lets finish while the gate drains: it also accepts `halting_v2` and `v2_halted` on the same exact epoch
    (local finalization is allowed in `v2_halted`, CV2-11-006; decision D-130). After an OrderingHandoff froze
    the lane no nonterminal execution of it exists, so nothing can settle past the handoff fence.
    """
    assert transaction.get_connection().in_atomic_block, "lock_serving runs inside the write's transaction"
    attempts = 1 + int(settings.CONNECTOR.get("GUARD_RETRY_LIMIT", 1))
    for _ in range(attempts):
        named = _named_epoch(account_id)
        if named is None:
            # An activation may be committing right now: wait for the gate row, then look again.
            locks.wait_for_gate(account_id)
            named = _named_epoch(account_id)
        if named is None:
            mode = AccountServingGate.objects.filter(account_id=account_id).values_list("mode", flat=True).first()
            raise GateNotServing(f"account {account_id} gate is {mode or 'absent'}; no epoch serves it")
        # The savepoint lets a lost race release both share locks before retrying, so the retry again locks
        # epoch before gate (never gate before epoch).
        sid = transaction.savepoint()
        epoch = locks.epoch_for_share(named)
        gate = locks.gate_for_share(account_id)
        if gate.epoch_id == epoch.pk:
            transaction.savepoint_commit(sid)
            break
        transaction.savepoint_rollback(sid)
    else:
        raise GateNotServing(f"account {account_id} gate kept moving between epochs; retry")
    allowed = ((GateMode.V2_SERVING, GateMode.HALTING_V2, GateMode.V2_HALTED) if settling
               else (GateMode.V2_SERVING,))
    if gate.mode not in allowed:
        raise GateNotServing(f"account {account_id} gate is {gate.mode}, not v2_serving")
    if expected_fence is not None and gate.fence != expected_fence:
        raise FenceStale(f"account {account_id} gate fence is {gate.fence}, the writer observed {expected_fence}")
    if epoch.state != EpochState.ACTIVE:
        raise GateNotServing(f"epoch {epoch.epoch_id} named by account {account_id} gate is {epoch.state}, "
                             "not active")
    stored = bytes(epoch.digest)
    if gate.epoch_digest is None or not hmac.compare_digest(bytes(gate.epoch_digest), stored):
        raise GateNotServing(f"account {account_id} gate names epoch {epoch.epoch_id} with a different digest")
    if epoch_id is not None and epoch_id != epoch.epoch_id:
        raise GateNotServing(f"writer bound to epoch {epoch_id}; the gate serves {epoch.epoch_id}")
    if epoch_digest is not None and not hmac.compare_digest(bytes(epoch_digest), stored):
        raise GateNotServing(f"writer's digest for epoch {epoch.epoch_id} differs from the exact epoch")
    return ServingContext(account_id, gate.pk, gate.fence, epoch.pk, epoch.epoch_id, stored)
