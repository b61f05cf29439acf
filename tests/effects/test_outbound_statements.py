"""Pinned statement counts of the outbound hot path (STYLE R27, issue 20; docs/benchmarks.md, issue 20 section).

One worker step of one effect (`effect_dispatch_once`: a batch of one, D-531) against the loopback receiver, in real
transactions (a transactional test, as in production). The counted effect is the second of the process (the first
warms the process's pooled HTTP client and caches). Statements are what Django's connection records, BEGIN/COMMIT
and savepoints included. Each stage is measured around the function the worker calls for it:

| stage | per-item path (issue 20, D-335, D-336) | one path, a batch of one (D-531) |
| --- | --- | --- |
| claim + permit (candidate reads + `effects_claim_batch`) | 13 | 10 |
| the sending marker (`win_sending_batch`, committed before any byte) | 7 | 7 |
| settlement + finalization (`permits_settle_confirmed`) | 13 | 10 |
| the whole step | 36 | 30 |

The batched step (`effect_dispatch_batch`, D-345..D-350), pinned below for n = 1 and n = 10 (constant in n): claim +
permits 10, the n sending markers 7, the n settlements + finalizations 10, the whole step 30 (3 per effect at n = 10).
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from effects.choices import EffectState
from effects.models import RemoteEffect
from effects.services import worker
from tests.effects.helpers import author

CLAIM_AND_PERMIT = 10
SENDING_MARKER = 7
SETTLE_AND_FINALIZE = 10
DISPATCH_STEP = 30


@pytest.fixture
def tx_push_world(transactional_db):
    from connector.demo import build_world

    return build_world("p-", push=True)


def _count_stages(monkeypatch, stages, step):
    """Run `step()`, counting the statements of each stage by wrapping the functions it calls (`stages`: (stage,
    module, function name)); returns the counts by stage, the step's total and its result."""
    counts: dict[str, int] = {}
    capture = CaptureQueriesContext(connection)

    def counted(stage, module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            start = len(capture.captured_queries)
            try:
                return real(*args, **kwargs)
            finally:
                counts[stage] = counts.get(stage, 0) + len(capture.captured_queries) - start
        monkeypatch.setattr(module, name, wrapper)

    for stage, module, name in stages:
        counted(stage, module, name)
    with capture:
        result = step()
    monkeypatch.undo()
    return counts, len(capture.captured_queries), result


def _stage_counts(monkeypatch, account) -> tuple[dict[str, int], int, RemoteEffect]:
    """Run one worker step of one effect (a batch of one), counting the statements of each stage."""
    from effects import egress_batch
    from effects.services import dispatch_batch

    return _count_stages(monkeypatch, [
        ("claim_and_permit", dispatch_batch, "claim_candidates"),
        ("claim_and_permit", dispatch_batch, "effects_claim_batch"),
        ("sending_marker", egress_batch, "win_sending_batch"),
        ("settle_and_finalize", egress_batch, "permits_settle_confirmed"),
    ], lambda: worker.effect_dispatch_once(holder_name="h-stmt", account_id=account.pk))


def test_outbound_dispatch_step_statements_are_pinned(tx_push_world, receiver, monkeypatch):
    """One effect's worker step: claim + permit in one transaction, the committed sending marker, settlement +
    finalization in one transaction, each within its pinned ceiling; the effect lands once and is finalized with
    its RemoteLink."""
    acme = tx_push_world.accounts[0]
    author(acme, root="order-warm", record_id="r-warm")
    assert worker.effect_dispatch_once(holder_name="h-stmt", account_id=acme.pk).state == EffectState.FINALIZED
    author(acme, root="order-counted", record_id="r-counted")
    counts, total, effect = _stage_counts(monkeypatch, acme)
    assert effect.state == EffectState.FINALIZED
    assert counts["claim_and_permit"] <= CLAIM_AND_PERMIT, counts
    assert counts["sending_marker"] <= SENDING_MARKER, counts
    assert counts["settle_and_finalize"] <= SETTLE_AND_FINALIZE, counts
    assert total <= DISPATCH_STEP, (counts, total)
    assert receiver.applied_total() == 2


# -- the batched step (issue 20, D-345..D-350) -------------------------------------------------------------------
# One `effect_dispatch_batch` step of n effects of one account (after a warm step), the same stages counted around
# the functions the step calls for them: the same count for any n (set-based statements; n = 1 and n = 10 pinned).
# The whole step also registers and heartbeats its holder and runs the limited-destination batch (D-372): its
# candidate read, one statement when no limited destination has work, is counted in claim_and_permit since the
# limited batch is claimed by the same `effects_claim_batch` (9 -> 10; it was the one-by-one companion step's
# read before, outside the counted stages; the step's total is unchanged).
BATCH_CLAIM_AND_PERMIT = 10
BATCH_SENDING_MARKER = 7
BATCH_SETTLE_AND_FINALIZE = 10
BATCH_DISPATCH_STEP = 30


def _batch_stage_counts(monkeypatch, account, n: int) -> tuple[dict[str, int], int, list[RemoteEffect]]:
    from effects import egress_batch
    from effects.services import dispatch_batch

    return _count_stages(monkeypatch, [
        ("claim_and_permit", dispatch_batch, "claim_candidates"),
        ("claim_and_permit", dispatch_batch, "effects_claim_batch"),
        ("sending_marker", egress_batch, "win_sending_batch"),
        ("settle_and_finalize", egress_batch, "permits_settle_confirmed"),
    ], lambda: worker.effect_dispatch_batch(n=n, holder_name="h-stmt", account_id=account.pk))


@pytest.mark.parametrize("n", [1, 10])
def test_outbound_batch_step_statements_are_pinned_for_any_n(tx_push_world, receiver, monkeypatch, n):
    """One batched worker step of n effects: claim + permits in one transaction, the n committed sending markers in
    one, the n settlements + finalizations in one; each stage within its pinned ceiling, the same for n = 1 and
    n = 10 (constant in n); every effect lands once and is finalized with its RemoteLink.
    Proves: CV2-10-036, CV2-10-037"""
    acme = tx_push_world.accounts[0]
    author(acme, root="order-warm", record_id="r-warm")
    assert [e.state for e in worker.effect_dispatch_batch(n=1, holder_name="h-stmt", account_id=acme.pk)] == [
        EffectState.FINALIZED]
    for i in range(n):
        author(acme, root=f"order-counted-{i}", record_id=f"r-counted-{i}")
    counts, total, effects = _batch_stage_counts(monkeypatch, acme, n)
    assert len(effects) == n and {e.state for e in effects} == {EffectState.FINALIZED}
    assert counts["claim_and_permit"] <= BATCH_CLAIM_AND_PERMIT, counts
    assert counts["sending_marker"] <= BATCH_SENDING_MARKER, counts
    assert counts["settle_and_finalize"] <= BATCH_SETTLE_AND_FINALIZE, counts
    assert total <= BATCH_DISPATCH_STEP, (counts, total)
    assert receiver.applied_total() == n + 1
