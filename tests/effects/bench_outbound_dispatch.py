"""Issue 20 benchmark (docs/benchmarks.md): one worker step of one effect against the loopback receiver, the old
path (effect_claim, permit_acquire, egress.send, effect_finalize_from_evidence: five transactions) against the new
(effect_claim_and_permit, egress.send with the fused settlement + finalization: three), alternating effect by
effect in one run. Not collected by default (run it by path: `pytest tests/effects/bench_outbound_dispatch.py -s`)."""
from __future__ import annotations

import statistics
import time

import pytest
from django.conf import settings

from effects import egress
from effects.choices import EffectState
from effects.services import dispatch, worker
from tests.effects.helpers import author

N = 200


def _old_step(account_id: int):
    holder = dispatch.holder_register(holder_id="h-bench-old")
    dispatch.holder_heartbeat(holder_id=holder.holder_id)
    claim = dispatch.effect_claim(holder=holder, lease_seconds=settings.CONNECTOR["LEASE_SECONDS"],
                                  account_id=account_id)
    permit = dispatch.permit_acquire(claim=claim)
    effect = egress.send(permit_pk=permit.pk, holder_id=holder.holder_id, holder_fence=permit.holder_fence,
                         credential_gate_fence=permit.credential_gate_fence, effect_pk=permit.effect_id,
                         account_id=claim.account_id,
                         credential_generation_pk=permit.credential_gate.credential_generation_id)
    return worker.effect_finalize_from_evidence(effect.pk, account_id=effect.account_id)


def _new_step(account_id: int):
    return worker.effect_dispatch_once(holder_name="h-bench-new", account_id=account_id)


@pytest.mark.django_db(transaction=True)
def test_bench_outbound_dispatch(receiver):
    from connector.demo import build_world

    acme = build_world("p-", push=True).accounts[0]
    for i in range(N + 2):
        author(acme, root=f"order-b{i}", record_id=f"r-b{i}")
    _old_step(acme.pk), _new_step(acme.pk)  # warm both
    times = {"old": [], "new": []}
    for i in range(N):
        name, step = (("old", _old_step), ("new", _new_step))[i % 2]
        began = time.perf_counter()
        effect = step(acme.pk)
        times[name].append(time.perf_counter() - began)
        assert effect.state == EffectState.FINALIZED
    assert receiver.applied_total() == N + 2
    for name, values in times.items():
        p90 = sorted(values)[int(len(values) * .9)]
        print(f"BENCH {name}: n={len(values)} mean={statistics.mean(values) * 1000:.2f} ms "
              f"median={statistics.median(values) * 1000:.2f} ms p90={p90 * 1000:.2f} ms")
    print(f"BENCH ratio new/old mean={statistics.mean(times['new']) / statistics.mean(times['old']):.3f} "
          f"median={statistics.median(times['new']) / statistics.median(times['old']):.3f}")
