"""Generation linearization on real PostgreSQL (contract `mutation_policies.linearization`, `admission_rules`,
`remote_job_semaphore`): concurrent admissions and submits on separate connections, the admission rules one by
one, range-scoped watermarks, the append policy, and the remote job semaphore's one-transaction reservation."""
from __future__ import annotations

from datetime import date, timedelta

import pytest
from django.db import connection

from connector.actors import Actor
from effects.delivery.errors import DeliveryError
from effects.models import DeliveryAttempt, DeliveryOperation, DeliveryParent, MayAttemptMarker
from effects.choices import CapacityState
from effects.services.delivery import execution, reconciliation, runner, setup
from tests.concurrency import run_concurrently
from tests.effects.delivery.world import NAMESPACE, T0, build

TX = pytest.mark.django_db(transaction=True, databases=["default", "journal"])
REFUSALS = {"REST_DELIVERY_STALE_GENERATION", "REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT",
            "REST_DELIVERY_INTENT_CONFLICT"}
DAY = timedelta(days=1)
OTHER_NAMESPACE = dict(NAMESPACE, tenant_id="tenant-8")


def refused(code: str, fn, *args, **kwargs) -> DeliveryError:
    with pytest.raises(DeliveryError) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, (info.value.code, info.value.detail)
    return info.value


def deliver(parent) -> list[str]:
    return runner.drive_parent(parent.pk)


def overlaps(a: DeliveryParent, b: DeliveryParent) -> bool:
    return a.scope.lower < b.scope.upper and b.scope.lower < a.scope.upper


# -- (a) concurrent overlapping admissions ------------------------------------------------------------------------

@TX
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlapping_admissions_linearize_under_postgresql_domain_lock(sync_receiver, seed):
    """Proves: overlapping_admissions_linearize_under_postgresql_domain_lock.
    Eight threads admit overlapping partition_replace parents of distinct generations at once. The outcome is
    that of some serial order of admissions: every admitted lower overlapping generation was admitted before
    every higher overlapping one (admitted_at and pk order agree), each refusal carries one of the contract's
    codes and is justified by an admission that precedes it, and no thread fails with anything else (no
    deadlock, no serialization error, no half-written plan)."""
    import random

    world = build(sync_receiver.url)
    rnd = random.Random(seed)
    n = 8
    revisions = list(range(n))
    rnd.shuffle(revisions)
    specs = []
    for i in range(n):
        start = T0 + timedelta(hours=6 * rnd.randrange(0, 6))
        specs.append({"parent_key": f"lin-{seed}-{i}", "start": start, "end": start + DAY,
                      "revision": revisions[i], "interval_end": T0 + 2 * DAY})

    results = run_concurrently([lambda spec=spec: world.plan(**spec) for spec in specs])

    admitted, refusals = [], []
    for spec, result in zip(specs, results):
        if isinstance(result, DeliveryError):
            assert result.code in REFUSALS, (result.code, result.detail)
            refusals.append((spec, result))
        else:
            assert not isinstance(result, BaseException), repr(result)
            assert result.state == "ADMITTED"
            admitted.append(DeliveryParent.objects.get(pk=result.pk))
    assert admitted, "some admission must win"
    assert len(admitted) + len(refusals) == n

    by_time = sorted(admitted, key=lambda p: p.admitted_at)
    for i, a in enumerate(by_time):
        # every child of an admitted parent is sealed with the parent's generation, the plan is whole
        assert set(a.children.values_list("state", flat=True)) == {"sealed"}
        for b in by_time[i + 1:]:
            assert a.admitted_at < b.admitted_at
            if overlaps(a, b):
                assert a.generation < b.generation, (
                    f"lower-admitted-after-higher: {a.parent_key}{a.generation} after {b.parent_key}{b.generation}")
    for spec, error in refusals:
        parent = DeliveryParent.objects.get(parent_key=spec["parent_key"])
        assert parent.state == "PLANNING" and not parent.children.exists()  # nothing of the plan admitted
        gen = (spec["interval_end"], spec["revision"])
        rivals = [a for a in admitted if overlaps(a, parent)]
        if error.code == "REST_DELIVERY_STALE_GENERATION":
            assert any(a.generation > gen for a in rivals), (spec, error.detail)
        elif error.code == "REST_DELIVERY_INTENT_CONFLICT":
            assert any(a.generation == gen for a in rivals), (spec, error.detail)
        else:  # nothing here is unresolved (all sealed): in-flight cannot justify a refusal
            pytest.fail(f"unexpected {error.code}: {error.detail}")


@TX
def test_same_generation_overlap_race_admits_exactly_one(sync_receiver):
    """Proves: overlapping_admissions_linearize_under_postgresql_domain_lock (a tie: two plans claim the same
    generation over overlapping scopes at once; exactly one is admitted, the other is INTENT_CONFLICT)."""
    world = build(sync_receiver.url)
    specs = [{"parent_key": "tie-a", "start": T0, "end": T0 + DAY},
             {"parent_key": "tie-b", "start": T0 + timedelta(hours=12), "end": T0 + DAY + timedelta(hours=12),
              "interval_end": T0 + DAY}]
    results = run_concurrently([lambda spec=spec: world.plan(**spec) for spec in specs])
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1, results
    assert isinstance(errors[0], DeliveryError) and errors[0].code == "REST_DELIVERY_INTENT_CONFLICT", errors
    assert DeliveryParent.objects.filter(state="ADMITTED").count() == 1


# -- (b)-(e) the admission rules -----------------------------------------------------------------------------------

def test_older_overlapping_generation_cannot_submit(world):
    """Proves: older_overlapping_generation_cannot_submit (lower_overlapping_generation_cannot_enter_submitting_
    after_higher_admission): a lower generation admitted first, then a higher overlapping one; the lower one's
    submit is REST_DELIVERY_STALE_GENERATION and it never enters SUBMITTING (no marker, no attempt)."""
    lower = world.plan(parent_key="low", revision=0)
    higher = world.plan(parent_key="high", revision=1, records=[{"at": (T0 + timedelta(hours=h)).isoformat(),
                                                                "id": f"n{h}"} for h in (1, 5, 9, 13)])
    assert (lower.state, higher.state) == ("ADMITTED", "ADMITTED")
    for child in lower.children.all():
        refused("REST_DELIVERY_STALE_GENERATION", execution.submit, child.pk)
        child.refresh_from_db()
        assert child.state == "sealed" and child.last_code == "REST_DELIVERY_STALE_GENERATION"
        assert child.attempt_ordinal == 0
    assert not MayAttemptMarker.objects.filter(operation__parent=lower).exists()
    assert not DeliveryAttempt.objects.filter(operation__parent=lower).exists()
    assert runner.step(lower.children.first().pk) == "sealed"  # the driver keeps it out too
    assert deliver(higher) == ["final_full_promoted", "final_full_promoted"]
    for child in lower.children.all():  # ... and for good, once the higher one applied
        refused("REST_DELIVERY_STALE_GENERATION", execution.submit, child.pk)


@pytest.mark.parametrize("mode", ["error_5xx", "drop"])
def test_new_generation_blocks_on_older_unresolved_overlap(world, sync_receiver, mode):
    """Proves: new_generation_blocks_on_older_unresolved_overlap (higher_generation_cannot_submit_while_lower_
    overlap_is_effect_unresolved): the lower generation ends final_unknown_not_accepted (the receiver applied
    and then answered 5xx / dropped the connection); a higher overlapping generation is refused
    REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT, also while the reconciliation is open, and admitted once an
    operator has reconciled the lower one (to fully applied: the higher one still stands above it)."""
    sync_receiver.queue(mode, mode)
    lower = world.plan(parent_key="low", revision=0)
    assert deliver(lower) == ["final_unknown_not_accepted", "final_unknown_not_accepted"]
    refused("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", world.plan, parent_key="high", revision=1)

    actor = Actor.for_user(world.admin)
    children = list(lower.children.order_by("ordinal"))
    reconciliation.reconcile_open(actor=actor, operation_pk=children[0].pk, expected_revision=DeliveryOperation.objects.get(pk=children[0].pk).revision, reconciliation_id="rc-1")
    refused("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", world.plan, parent_key="high", revision=1)
    reconciliation.reconcile_resolve(actor=actor, operation_pk=children[0].pk, expected_revision=DeliveryOperation.objects.get(pk=children[0].pk).revision, reconciliation_id="rc-1",
                                     target="final_full_not_accepted_eligible",
                                     proof={"applied_count": children[0].record_count, "source": "receiver-export"})
    # the second child is still unknown: its overlap still blocks
    refused("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", world.plan, parent_key="high", revision=1)
    reconciliation.reconcile_open(actor=actor, operation_pk=children[1].pk, expected_revision=DeliveryOperation.objects.get(pk=children[1].pk).revision, reconciliation_id="rc-2")
    reconciliation.reconcile_resolve(actor=actor, operation_pk=children[1].pk, expected_revision=DeliveryOperation.objects.get(pk=children[1].pk).revision, reconciliation_id="rc-2",
                                     target="final_not_started",
                                     proof={"applied_count": 0, "source": "receiver-export"})
    higher = world.plan(parent_key="high", revision=1)
    assert higher.state == "ADMITTED"
    assert deliver(higher) == ["final_full_promoted", "final_full_promoted"]


def test_submitting_lower_overlap_blocks_higher_admission_until_proven_not_started(world, sync_receiver):
    """Proves: new_generation_blocks_on_older_unresolved_overlap (SUBMITTING is unresolved: while the lower
    generation's attempt may be on the wire, a higher overlapping plan is REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT;
    once orphan recovery proves the request never left (retry_wait, no effect), the higher one is admitted and the
    lower one is then stale)."""
    one = [{"at": T0.isoformat(), "id": "a"}]
    lower = world.plan(parent_key="low", records=one)
    low_op = lower.children.get()
    assert execution.submit(low_op.pk).submitted  # the worker then died before attempt_start_io
    refused("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", world.plan, parent_key="high", revision=1, records=one)
    assert runner.recover_orphan(low_op.pk) == "retry_wait"
    higher = world.plan(parent_key="high", revision=1, records=one)
    assert higher.state == "ADMITTED"
    refused("REST_DELIVERY_STALE_GENERATION", execution.submit, low_op.pk)
    assert sync_receiver.mutations() == []


def test_fully_applied_generation_permanently_stales_every_lower_overlap(world, sync_receiver):
    """Proves: fully_applied_generation_permanently_stales_every_lower_overlap and
    physical_receiver_effects_share_conflict_domain_across_local_namespaces_and_mutation_kinds: after a full
    application, a lower overlapping generation is REST_DELIVERY_STALE_GENERATION in the same namespace, in
    another local namespace, and through another profile (async bulk job) of the same physical receiver resource;
    the incremental_append profile of that resource maps to the very same effect conflict domain row."""
    higher = world.plan(parent_key="high", revision=3)
    assert deliver(higher) == ["final_full_promoted", "final_full_promoted"]
    assert higher.domain.watermarks.count() == 1

    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="low-same-ns", revision=2)
    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="low-other-ns", revision=1,
            namespace=OTHER_NAMESPACE, start=T0 + timedelta(hours=20), end=T0 + 2 * DAY, interval_end=T0 + DAY)
    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="low-async", revision=0,
            profile=world.asyncp, namespace=OTHER_NAMESPACE, start=T0 - DAY, end=T0 + timedelta(hours=1))
    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="equal", revision=3,
            namespace=OTHER_NAMESPACE)  # equal is not above: also stale
    # an earlier scheduled interval with a larger correction revision is still lower
    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="earlier-interval", revision=99,
            interval_end=T0 + DAY - timedelta(seconds=1), namespace=OTHER_NAMESPACE)
    # the append profile of the same resource shares the domain row (and thus its lock)
    append = world.plan(parent_key="append", profile=world.append, namespace=OTHER_NAMESPACE,
                        start=date(2026, 11, 1), end=date(2026, 11, 2), interval_end=T0 + DAY,
                        records=[{"at": "2026-11-01", "id": "a"}])
    refused_parents = DeliveryParent.objects.exclude(pk__in=[higher.pk, append.pk])
    assert {p.domain_id for p in refused_parents} | {append.domain_id} == {higher.domain_id}
    assert not DeliveryOperation.objects.filter(parent__in=refused_parents).exists()
    # a higher generation is still admitted and replaces
    assert world.plan(parent_key="higher-still", revision=4, namespace=OTHER_NAMESPACE).state == "ADMITTED"
    # another resource is another domain: the watermark does not reach it
    assert world.plan(parent_key="other-resource", revision=0, resource="invoices").state == "ADMITTED"


def test_generation_watermark_is_range_scoped(world):
    """Proves: generation_watermark_is_range_scoped: after generation 5 applied over [T0, T0+1d), a lower
    generation over the adjacent [T0+1d, T0+2d) and over [T0-1d, T0) is admitted (and delivers), an overlapping
    one is stale, and the map then holds each range at its own generation. (All generations here share the
    scheduled interval end; only the correction revision orders them.)"""
    high = world.plan(parent_key="high", revision=5)
    assert deliver(high) == ["final_full_promoted", "final_full_promoted"]
    after = world.plan(parent_key="after", start=T0 + DAY, end=T0 + 2 * DAY, revision=1, interval_end=T0 + DAY)
    before = world.plan(parent_key="before", start=T0 - DAY, end=T0, revision=0, interval_end=T0 + DAY)
    assert (after.state, before.state) == ("ADMITTED", "ADMITTED")
    refused("REST_DELIVERY_STALE_GENERATION", world.plan, parent_key="straddle", start=T0 + timedelta(hours=23),
            end=T0 + DAY + timedelta(hours=1), revision=4, interval_end=T0 + DAY,
            records=[{"at": (T0 + timedelta(hours=23)).isoformat(), "id": "s"}])
    assert deliver(after) == ["final_full_promoted", "final_full_promoted"]
    assert deliver(before) == ["final_full_promoted", "final_full_promoted"]
    marks = sorted((w.scope.lower, w.scope.upper, w.correction_revision) for w in high.domain.watermarks.all())
    assert marks == [(T0 - DAY, T0, 0), (T0, T0 + DAY, 5), (T0 + DAY, T0 + 2 * DAY, 1)]


# -- (f) incremental append -----------------------------------------------------------------------------------

D0, D1, D2 = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)


def test_incremental_append_rejects_correction_generation_by_default(world, sync_receiver):
    """Proves: incremental_append_rejects_correction_generation_by_default: an explicit correction revision on
    the append profile is refused (REST_DELIVERY_INTENT_CONFLICT) before anything is materialized; with the
    contract's certified exception recorded on the profile it is admitted."""
    refused("REST_DELIVERY_INTENT_CONFLICT", world.plan, parent_key="corr", profile=world.append, start=D0, end=D1,
            revision=1, interval_end=T0 + DAY, records=[{"at": "2026-11-01", "id": "a"}])
    assert not DeliveryParent.objects.filter(parent_key="corr").exists()
    from tests.effects.delivery.world import policy, semantics

    certified = setup.profile_create(
        actor=Actor.for_user(world.admin), name="append-certified", receiver_kind="sync_batch",
        mutation_policy="incremental_append", scope_kind="date", operation_semantics=semantics("/append-upsert"),
        execution_policy=policy(), profile_schema_id="dpone.rest_delivery_profile.v1", profile_version=1,
        max_records_per_child=10, append_exception={
            "certified_receiver_deduplication_or_upsert": "cert-77",
            "natural_idempotent_key_or_replacement_semantics": "natural key id",
            "explicit_compensating_correction_contract": "adr-0050"})
    ok = world.plan(parent_key="corr-ok", profile=certified, start=D0, end=D1, revision=1, interval_end=T0 + DAY,
                    records=[{"at": "2026-11-01", "id": "a"}])
    assert ok.state == "ADMITTED"


def test_append_scope_already_applied(world, sync_receiver):
    """Proves: incremental_append_rejects_correction_generation_by_default (already_applied_action: block): once
    an append scope is fully applied, another admission of exactly that scope is
    REST_DELIVERY_APPEND_SCOPE_ALREADY_APPLIED (in any local namespace, any generation); while it is unresolved
    it is REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT; a different (even overlapping) scope is not blocked."""
    rec = [{"at": "2026-11-01", "id": "a"}, {"at": "2026-11-01", "id": "b"}]
    first = world.plan(parent_key="a1", profile=world.append, start=D0, end=D1, interval_end=T0 + DAY, records=rec)
    assert deliver(first) == ["final_full_promoted"]
    assert sync_receiver.mutations()[0]["path"] == "/append"
    for key, ns, gen in [("a2", NAMESPACE, T0 + 2 * DAY), ("a3", OTHER_NAMESPACE, T0 + DAY),
                         ("a4", OTHER_NAMESPACE, T0 + 5 * DAY)]:
        refused("REST_DELIVERY_APPEND_SCOPE_ALREADY_APPLIED", world.plan, parent_key=key, profile=world.append,
                start=D0, end=D1, interval_end=gen, records=rec, namespace=ns)
    wider = world.plan(parent_key="wider", profile=world.append, start=D0, end=D2, interval_end=T0 + 2 * DAY,
                       records=rec)
    assert wider.state == "ADMITTED"  # scope_conflict_mode: exact

    sync_receiver.queue("error_5xx")
    nxt = world.plan(parent_key="b1", profile=world.append, start=D1, end=D2, interval_end=T0 + 2 * DAY,
                     records=[{"at": "2026-11-02", "id": "c"}])
    assert deliver(nxt) == ["final_unknown_not_accepted"]
    refused("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", world.plan, parent_key="b2", profile=world.append,
            start=D1, end=D2, interval_end=T0 + 3 * DAY, records=[{"at": "2026-11-02", "id": "c"}])


# -- (g) the remote job semaphore ----------------------------------------------------------------------------------

def _capacity_one(world) -> None:
    sem = setup.semaphore_ensure(remote_principal_id=world.binding.remote_principal_id, profile=world.sync)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE effects_remotejobsemaphore SET capacity = 1 WHERE id = %s", [sem.pk])


@TX
@pytest.mark.parametrize("round_", range(3))
def test_remote_job_capacity_and_submitting_share_one_postgresql_transaction(sync_receiver, round_):
    """Proves: remote_job_capacity_and_submitting_share_one_postgresql_transaction and
    remote_job_semaphore_reserved_before_submit: with capacity 1, two threads submit two operations (different
    parents and effect conflict domains, so only the semaphore row orders them) at once: exactly one enters
    SUBMITTING with a reserved attempt bound to its MAY_ATTEMPT marker; the other waits for "capacity" and wrote
    no marker, no attempt and no transition. Once the first settles (capacity released), the second submits."""
    world = build(sync_receiver.url)
    _capacity_one(world)
    one = [{"at": T0.isoformat(), "id": "a"}]
    a = world.plan(parent_key="sa", group="ga", records=one)
    b = world.plan(parent_key="sb", group="gb", start=T0 + DAY, end=T0 + 2 * DAY,
                   records=[{"at": (T0 + DAY).isoformat(), "id": "b"}])
    assert a.domain_id != b.domain_id
    ops = [a.children.get().pk, b.children.get().pk]

    results = run_concurrently([lambda pk=pk: execution.submit(pk) for pk in ops])
    assert not any(isinstance(r, BaseException) for r in results), results
    winners = [pk for pk, r in zip(ops, results) if r.submitted]
    losers = [(pk, r) for pk, r in zip(ops, results) if not r.submitted]
    assert len(winners) == 1 and len(losers) == 1, results
    (won,), ((lost, lost_result),) = winners, losers
    assert lost_result.waiting_for == "capacity"
    won_op = DeliveryOperation.objects.get(pk=won)
    assert won_op.state == "submitting" and won_op.attempt_ordinal == 1
    attempt = DeliveryAttempt.objects.get(operation_id=won)
    assert attempt.capacity_state == CapacityState.RESERVED and attempt.marker.attempt_id == attempt.attempt_id
    assert not attempt.io_may_have_started
    lost_op = DeliveryOperation.objects.get(pk=lost)
    assert (lost_op.state, lost_op.attempt_ordinal, lost_op.revision) == ("sealed", 0, 1)
    assert not MayAttemptMarker.objects.filter(operation_id=lost).exists()
    assert not DeliveryAttempt.objects.filter(operation_id=lost).exists()
    assert sync_receiver.mutations() == []

    # still no capacity while the first holds its reservation
    assert execution.submit(lost).waiting_for == "capacity"
    from effects import egress

    egress.delivery_send(attempt_pk=attempt.pk)
    assert runner.step(won) in ("final_full_promoted", "final_full_eligible")
    attempt.refresh_from_db()
    assert attempt.capacity_state == CapacityState.RELEASED
    assert execution.submit(lost).submitted


@TX
def test_unknown_remote_job_retains_capacity_until_reconciliation(sync_receiver):
    """Proves: unknown_remote_job_retains_capacity_until_reconciliation (with capacity 1, an unknown effect keeps
    the only slot: another operation waits for capacity until the reconciliation resolves the unknown one)."""
    world = build(sync_receiver.url)
    _capacity_one(world)
    one = [{"at": T0.isoformat(), "id": "a"}]
    a = world.plan(parent_key="ua", group="ga", records=one)
    b = world.plan(parent_key="ub", group="gb", start=T0 + DAY, end=T0 + 2 * DAY,
                   records=[{"at": (T0 + DAY).isoformat(), "id": "b"}])
    sync_receiver.queue("error_5xx")
    a_op, b_op = a.children.get(), b.children.get()
    assert runner.step(a_op.pk) == "final_unknown_not_accepted"
    assert DeliveryAttempt.objects.get(operation=a_op).capacity_state == CapacityState.RESERVED
    assert execution.submit(b_op.pk).waiting_for == "capacity"
    actor = Actor.for_user(world.admin)
    reconciliation.reconcile_open(actor=actor, operation_pk=a_op.pk, expected_revision=DeliveryOperation.objects.get(pk=a_op.pk).revision, reconciliation_id="rc-u")
    reconciliation.reconcile_resolve(actor=actor, operation_pk=a_op.pk, expected_revision=DeliveryOperation.objects.get(pk=a_op.pk).revision, reconciliation_id="rc-u",
                                     target="final_full_not_accepted_eligible",
                                     proof={"applied_count": 1, "source": "receiver-export"})
    assert DeliveryAttempt.objects.get(operation=a_op).capacity_state == CapacityState.RELEASED
    assert execution.submit(b_op.pk).submitted


@TX
def test_remote_job_semaphore_reserved_before_submit(sync_receiver, monkeypatch):
    """The remote job slot is reserved before the operation becomes SUBMITTING, in the same transaction: at the
    moment `submit` asks for `sealed -> submitting`, the operation's attempt already holds RESERVED capacity on the
    principal's semaphore (seen from inside that transaction), and a full semaphore refuses the submit with
    nothing written. Proves: remote_job_semaphore_reserved_before_submit"""
    world = build(sync_receiver.url)
    _capacity_one(world)
    one = [{"at": T0.isoformat(), "id": "a"}]
    a = world.plan(parent_key="ra", group="ga", records=one)
    b = world.plan(parent_key="rb", group="gb", start=T0 + DAY, end=T0 + 2 * DAY,
                   records=[{"at": (T0 + DAY).isoformat(), "id": "b"}])
    a_op, b_op = a.children.get().pk, b.children.get().pk
    seen = []
    real_move = execution.move

    def observing_move(op, target, **kwargs):
        if target == "submitting":
            seen.append(list(DeliveryAttempt.objects.filter(operation_id=op.pk).values_list(
                "ordinal", "capacity_state", "semaphore__capacity")))
        return real_move(op, target, **kwargs)

    monkeypatch.setattr(execution, "move", observing_move)
    assert execution.submit(a_op).submitted
    assert seen == [[(1, CapacityState.RESERVED, 1)]]
    assert DeliveryOperation.objects.get(pk=a_op).state == "submitting"
    # The only slot is held: the next submit reserves nothing, so it never reaches the transition.
    assert execution.submit(b_op).waiting_for == "capacity"
    assert len(seen) == 1
    assert (DeliveryOperation.objects.get(pk=b_op).state, DeliveryAttempt.objects.filter(operation_id=b_op).count(),
            MayAttemptMarker.objects.filter(operation_id=b_op).count()) == ("sealed", 0, 0)


def test_physical_receiver_effects_share_conflict_domain_across_local_namespaces_and_mutation_kinds():
    """The conflict domain digest has no namespace and no mutation kind: two namespaces and both mutation kinds
    writing one receiver resource share one domain; another resource or group is another domain.
    Proves: physical_receiver_effects_share_conflict_domain_across_local_namespaces_and_mutation_kinds"""
    from effects.delivery import identity as ident
    from effects.services.delivery.planning import ConflictDomain

    fields = ident.identity_fields("effect_conflict_domain")
    assert "operation_namespace" not in fields and "mutation_kind" not in fields
    base = ConflictDomain("svc", "acct", "ns", "orders", "g1")
    assert base.digest() == ConflictDomain("svc", "acct", "ns", "orders", "g1").digest()
    assert base.digest() != ConflictDomain("svc", "acct", "ns", "invoices", "g1").digest()
    assert base.digest() != ConflictDomain("svc", "acct", "ns", "orders", "g2").digest()
