"""The V1 runtime the service cuts over from: barriers stop new roots only, accepted work keeps authoring and
finishing its effects, the pre-I/O marker precedes every provider byte, and process generations never revive."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import IntegrityError, connection, connections, transaction

from cutover.ports import BarrierKind
from v1 import runtime
from v1.errors import V1BarrierClosed, V1GenerationRefused
from v1.models import (
    EFFECT_TRANSITIONS,
    GENERATION_TRANSITIONS,
    WORK_TRANSITIONS,
    EffectState,
    GenerationState,
    V1OutboundEffect,
    V1ProcessGeneration,
    V1SourceCursor,
    V1WorkItem,
    WorkState,
)
from v1.owner import V1Owner
from tests import dbroles
from tests.support import scaled

TX = pytest.mark.django_db(transaction=True)


def accept(key: str, position: int = 1, account: str = "acme", partition: str = "r1"):
    return runtime.accept(account_key=account, source_key="webhook", transport_key=key,
                          payload=f'{{"k":"{key}"}}'.encode(), partition=partition, position=position)


@pytest.mark.django_db
def test_accepted_work_finishes_with_one_provider_call_each(provider, generation):
    """Each accepted item authors one continuation effect, commits `dispatching` before the call, and finishes
    `finalized` with the high-water advanced; a transport duplicate is recognized, not accepted twice."""
    accept("t1", 1)
    accept("t2", 2)
    item, created = accept("t1", 1)
    assert not created and V1WorkItem.objects.count() == 2
    assert runtime.drain(generation.generation_id) == 2
    assert set(V1WorkItem.objects.values_list("state", flat=True)) == {WorkState.DONE}
    assert set(V1OutboundEffect.objects.values_list("state", flat=True)) == {EffectState.FINALIZED}
    assert provider.applied_total() == 2 and len(provider.requests) == 2
    water = V1Owner().high_waters(["acme"])
    assert [(w.partition_key, w.high_water) for w in water] == [(b"r1", b"2")]


@pytest.mark.django_db
def test_barriers_refuse_new_roots_but_accepted_work_still_finishes(provider, generation):
    """With every barrier closed: a new inbound item and a new root outbound request are refused retryably and
    write nothing (the cursor does not move), while an item accepted before the close still authors and
    finalizes its effect. Proves: CV2-12-022, CV2-12-023, CV2-12-026, CV2-12-086"""
    owner = V1Owner()
    accept("before", 5)
    cursor_before = V1SourceCursor.objects.get(source_key="webhook").cursor
    for kind in BarrierKind:
        receipt = owner.close_barrier(kind, "att-1")
        assert receipt.attempt_key == "att-1" and receipt.subject == kind.value and len(receipt.digest) == 32
    with pytest.raises(V1BarrierClosed) as refused:
        accept("after", 6)
    assert refused.value.retryable
    with pytest.raises(V1BarrierClosed):
        runtime.request_root_outbound(account_key="acme", request_key="root-1", body=b"{}")
    assert not V1WorkItem.objects.filter(transport_key="after").exists()
    assert not V1OutboundEffect.objects.filter(request_key="root-1").exists()
    assert V1SourceCursor.objects.get(source_key="webhook").cursor == cursor_before
    runtime.drain(generation.generation_id)
    assert V1WorkItem.objects.get(transport_key="before").state == WorkState.DONE
    assert provider.applied_total() == 1
    owner.reopen_barrier(BarrierKind.INGRESS, "att-1")
    assert accept("after", 6)[1]


@TX
def test_a_transaction_crossing_the_close_commits_and_joins_the_drain(provider):
    """An accept already inside its transaction when the ingress barrier closes commits (the close waits for it)
    and appears in the inventory that the drain must empty. Proves: CV2-12-030, CV2-12-079, CV2-12-086"""
    inside, release = threading.Event(), threading.Event()
    errors = []

    def slow_accept():
        try:
            with transaction.atomic():
                runtime._open_barrier("ingress")
                inside.set()
                release.wait(scaled(10))
                accept("crossing", 1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=slow_accept)
    worker.start()
    assert inside.wait(scaled(10))
    closed_at = {}

    def close():
        V1Owner().close_barrier(BarrierKind.INGRESS, "att-x")
        closed_at["t"] = time.monotonic()
        connections.close_all()

    closer = threading.Thread(target=close)
    closer.start()
    time.sleep(0.5)
    assert "t" not in closed_at, "closing must wait for the transaction crossing the barrier"
    released = time.monotonic()
    release.set()
    worker.join(scaled(10))
    closer.join(scaled(10))
    assert not errors and closed_at["t"] >= released
    blocking = V1Owner().inventory(["acme"]).blocking
    assert [(b.kind, b.detail.split()[0]) for b in blocking] == [("inbound_nonterminal", "crossing")]
    with pytest.raises(V1BarrierClosed):
        accept("late", 2)


@TX
def test_an_interrupted_dispatch_is_io_may_have_started(provider, run_child):
    """A real V1 worker process SIGKILLed after committing the pre-I/O marker leaves the effect `dispatching`:
    the inventory reports `io_may_have_started` (never safe by timeout) until it is reconciled with evidence.
    Proves: CV2-12-035, CV2-12-036, CV2-12-040, CV2-12-080"""
    generation = runtime.generation_start(started_by="test")
    accept("t1", 1)
    child = run_child("""
        from v1 import runtime
        runtime.drain(ARGS["generation"])
        emit(done=True)
    """, "v1.after_dispatching", generation=generation.generation_id)
    assert child.killed, child.stderr
    owner = V1Owner()
    kinds = sorted(b.kind for b in owner.inventory(["acme"]).blocking)
    assert kinds == ["io_may_have_started", "io_may_have_started"]  # the effect and its leased item
    assert provider.requests == []
    effect = V1OutboundEffect.objects.get()
    with transaction.atomic():
        owner.reconcile_effect(str(effect.pk), "no_effect", b"provider ledger: no request with this key", "att-1")
    assert owner.inventory(["acme"]).blocking == ()
    assert V1WorkItem.objects.get().state == WorkState.DONE


@TX
def test_a_terminated_generation_never_runs_or_reaches_the_provider_again(provider, run_child):
    """Termination stops a real worker process of that generation and it can never restart; isolated egress never
    reopens (PostgreSQL refuses); a cold start is a NEW generation. Proves: CV2-12-037, CV2-12-038, CV2-12-072,
    CV2-12-095"""
    owner = V1Owner()
    generation = runtime.generation_start(started_by="test")
    gid = generation.generation_id
    receipt = owner.terminate_generation(gid, "att-1")
    owner.isolate_egress(gid, "att-1")
    assert receipt.kind == "generation.terminated" and b"restartable" in receipt.payload
    child = run_child("""
        from django.core.management import call_command
        from django.core.management.base import CommandError
        try:
            call_command("v1_worker", "--generation", ARGS["generation"], "--once")
            emit(started=True)
        except CommandError as exc:
            emit(started=False, error=str(exc))
    """, generation=gid)
    assert child.result() == {"started": False, "error": child.result()["error"]}
    assert "V1_GENERATION_REFUSED" in child.result()["error"]
    accept("t1", 1)
    with pytest.raises(V1GenerationRefused):
        runtime.work_once(gid)
    with pytest.raises(IntegrityError, match="never reopens"), transaction.atomic():
        V1ProcessGeneration.objects.filter(generation_id=gid).update(egress_isolated=False)
    with pytest.raises(IntegrityError), transaction.atomic():
        V1ProcessGeneration.objects.filter(generation_id=gid).update(state=GenerationState.RUNNING)
    fresh = owner.start_generation(generation.release_id, "att-1")
    assert fresh.generation_id != gid and fresh.state == GenerationState.RUNNING
    runtime.drain(fresh.generation_id)
    assert provider.applied_total() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("table,edges,states", [
    ("v1_v1processgeneration", GENERATION_TRANSITIONS, GenerationState.values),
    ("v1_v1workitem", WORK_TRANSITIONS, WorkState.values),
    ("v1_v1outboundeffect", EFFECT_TRANSITIONS, EffectState.values),
])
def test_postgresql_refuses_every_unlisted_v1_transition(table, edges, states, generation):
    """Every (source, target) pair outside the transition table is refused by the trigger, every listed one
    accepted. Proves: CV2-02-034"""
    accept("t1", 1)
    V1OutboundEffect.objects.create(account_key="acme", request_key="k", request_body=b"{}",
                                    request_digest=b"\0" * 32)
    allowed = {(str(a), str(b)) for a, b in edges}
    for source in states:
        for target in states:
            if source == target:
                continue
            with connection.cursor() as cursor:
                try:
                    with transaction.atomic():
                        dbroles.admin_on(cursor)
                        cursor.execute("SET LOCAL session_replication_role = replica")
                        cursor.execute(f"UPDATE {table} SET state = %s WHERE id = (SELECT min(id) FROM {table})",
                                       [source])
                        cursor.execute("SET LOCAL session_replication_role = origin")
                        dbroles.admin_off(cursor)
                        cursor.execute(f"UPDATE {table} SET state = %s WHERE id = (SELECT min(id) FROM {table})",
                                       [target])
                        ok = True
                        raise _Rollback
                except _Rollback:
                    pass
                except IntegrityError:
                    ok = False
            assert ok == ((source, target) in allowed), (table, source, target)


class _Rollback(Exception):
    pass
