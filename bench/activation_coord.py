"""The real coordinators of `bench activation` (issue 19): the V1 -> V2 cutover's first activation through the
barrier set and the CutoverDecision (`--scenario cutover`), and the V2 -> V2 successor activation with K ordering
lanes per account handed off (`--scenario successor --partitions K`). Both measure with bench/activation.py's
`_measure`: one attempt killed mid-transaction, the raw set-based shape of the same rows (rolled back), the timed
retry (for `cutover`, the resume `first_activation_commit`), the readback.

`build_cutover_world`: `build_activation_world` (N accounts, gates `v2_validating`, a verified epoch), then the
world a real cutover has just before `first_activation_commit`. The per-service facts the activation reads are ONE
row each, written by the bench, not by the V1 shutdown path (which needs a running V1, its drain and a pg_dump of
the service): the ServiceCutoverAttempt (its exhaustive account set digest computed by
`cutover.services.preflight.account_set_digest`, as `cutover_open` does), the CutoverReadinessCertificate, the
V1ShutdownCertificate, and in the journal the V1RestorePoint (a small dump file whose sha256 and size it records)
with one RestorePointRehearsal. The activation reads only their digests (`first_activation.activation_evidence`),
and `rehearsed_restore_point` verifies the dump file. Then through the services: `decision_open` (CutoverDecision
`rollback_open`), `first_activation_acquire`, `first_activation_hold` (the owner reread under the held set), and the
dual approval of the activation decision (`approval_request` by one user, `approval_give` by two others of the
`approver` group). Kill point: the product's crash point `activation.before_commit` (paused, not self-killed).

`build_successor_world`: the first-activation world activated (`epoch_activate_first`), K OrderingLanes per account
on the predecessor written in bulk (route `records.webhook` at the template account's route version and contract,
partitions p-0..p-K-1, `open`, high-water a per-lane number except the last partition's, which never completed:
NULL), a successor epoch prepared and verified from the same configuration, every gate halted by
`cutover.services.succession_phases.halt_all` (the product's path: two `gate_transition`s per gate), the barrier
set acquired and held, then the handoffs IN BULK: `handoff_all` calls `ordering_handoff` once per lane and each
share-locks every gate (O(N) per lane, O(K N^2) in all: 4,000 handoffs at 1,000 accounts each reading 1,000 gates),
so the bench writes in one transaction exactly what `ordering_handoff` writes per lane: the predecessor lane frozen
(`halted`, ORDERING_HANDOFF, fence + 1), the successor lane (baseline = high-water = the frozen high-water, origin
`ordering_handoff`, the successor's route version), the OrderingHandoff with its digest computed by
`handoff_digests.digest_of_handoff` and the contract digest by `succession.contract_digest`, and its `ordering_handoff`
audit row. `successor_activate` then locks 2KN lanes and byte-checks every handoff against them. `--handoffs
service` runs `handoff_all` instead (for when it is set-based; tests compare the two paths' rows).
"""
from __future__ import annotations

import hashlib
import tempfile
import time
import uuid
from pathlib import Path

from django.db import connection, transaction

from bench.activation import ActivationResult, _measure
from bench.activation_world import (ACTOR, ActivationBenchError, ActivationWorld, Progress, _analyze, _copy,
                                    _fresh_session, _timed, build_activation_world, gate_fences)

DEFAULT_PARTITIONS = 4
HANDOFF_PATHS = ("bulk", "service")  # --handoffs: bulk rows, or cutover.services.succession_phases.handoff_all
ROUTE = "records.webhook"
APPROVERS = ("requester", "approver-a", "approver-b")


# -- the cutover's first activation ------------------------------------------------------------------------------

def _fact(model, *, using: str = "default", seed: str, **given):
    """One row of `model`: the given values, and for every other required column a value of its type (digests
    sha256 of the seed and the column name, so each is unique)."""
    from django.db import models

    values = dict(given)
    for f in model._meta.concrete_fields:
        if (f.primary_key or f.name in values or f.attname in values or f.null or f.has_default()
                or getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)):
            continue
        if isinstance(f, models.BinaryField):
            values[f.name] = hashlib.sha256(f"{seed}:{model.__name__}.{f.name}".encode()).digest()
        elif isinstance(f, models.JSONField):
            values[f.name] = {}
        elif isinstance(f, (models.CharField, models.TextField)):
            values[f.name] = ACTOR
        elif isinstance(f, models.IntegerField):
            values[f.name] = 1
        else:
            raise ActivationBenchError(f"no bench value for {model.__name__}.{f.name}")
    return model.objects.using(using).create(**values)


def _cutover_facts(world: ActivationWorld, attempt_key: str, epoch) -> None:
    """The attempt, its certificates and its rehearsed restore point (see the module docstring)."""
    from config.routers import JOURNAL_DB
    from connector.actors import Actor
    from connector.services.audit import audit_record
    from cutover.models import (
        CutoverReadinessCertificate,
        RestorePointRehearsal,
        ServiceCutoverAttempt,
        V1RestorePoint,
        V1ShutdownCertificate,
    )
    from cutover.services.preflight import account_set_digest

    config = epoch.configuration
    with transaction.atomic():
        attempt = ServiceCutoverAttempt.objects.create(
            attempt_key=attempt_key, configuration=config, candidate_epoch=epoch,
            candidate_epoch_digest=bytes(epoch.digest), v1_release_id="bench-v1", v1_generation_id="bench-v1-g1",
            account_set_digest=account_set_digest(config), account_count=world.accounts, opened_by=f"system:{ACTOR}")
        audit_record(actor=Actor.system(ACTOR), entity=attempt, action="cutover_open", to_state=attempt.outcome,
                     evidence_digest=bytes(attempt.account_set_digest))
        _fact(CutoverReadinessCertificate, seed=attempt_key, attempt=attempt, epoch_id=epoch.epoch_id,
              epoch_digest=bytes(epoch.digest), configuration_generation_id=config.generation_id, routes=[])
        _fact(V1ShutdownCertificate, seed=attempt_key, attempt=attempt,
              account_set_digest=bytes(attempt.account_set_digest))
    dump = Path(tempfile.gettempdir()) / "bench-activation" / f"{attempt_key}-{uuid.uuid4().hex}.dump"
    dump.parent.mkdir(parents=True, exist_ok=True)
    content = f"bench activation restore point of {attempt_key}\n".encode() * 64
    dump.write_bytes(content)
    with transaction.atomic(using=JOURNAL_DB):
        point = _fact(V1RestorePoint, using=JOURNAL_DB, seed=attempt_key, attempt_key=attempt_key,
                      dump_path=str(dump), dump_sha256=hashlib.sha256(content).digest(), dump_bytes=len(content))
        _fact(RestorePointRehearsal, using=JOURNAL_DB, seed=attempt_key, restore_point=point,
              attempt_key=attempt_key, dump_sha256=hashlib.sha256(content).digest())


def _approve_activation(epoch_id: str, prefix: str) -> None:
    """The dual approval of the activation decision: a requester and two approvers of the `approver` group."""
    from django.contrib.auth.models import Group, User

    from connector.actors import Actor
    from connector.services import approvals

    group = Group.objects.get(name="approver")
    people = []
    for role in APPROVERS:
        user = User.objects.create_user(f"{prefix}bench-{role}")
        user.groups.add(group)
        people.append(Actor.for_user(User.objects.get(pk=user.pk)))
    request = approvals.approval_request(kind="activation_decision", subject_key=epoch_id, actor=people[0],
                                         reason="bench: activation", evidence_ref="bench")
    for approver in people[1:]:
        approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest), actor=approver)


def build_cutover_world(accounts: int, *, prefix: str = "", progress: Progress | None = None) -> ActivationWorld:
    """The world just before `first_activation_commit` of a V1 -> V2 cutover (module docstring)."""
    from connector.actors import Actor
    from connector.models import ServingEpoch
    from cutover.choices import BarrierSetState
    from cutover.services import decision as decisions
    from cutover.services import first_activation as fa

    say = progress or (lambda _msg: None)
    actor = Actor.system(ACTOR)
    world = build_activation_world(accounts, prefix=prefix, progress=say)
    seconds, began = world.setup_seconds, time.monotonic()
    epoch = ServingEpoch.objects.select_related("configuration").get(pk=world.epoch_pk)
    attempt_key = f"{prefix}bench-cutover"
    say("  cutover world: attempt, readiness and shutdown certificates, rehearsed restore point; decision "
        "rollback_open")
    _timed(seconds, "cutover_facts", _cutover_facts, world, attempt_key, epoch)
    decisions.decision_open(attempt_key)
    say("  cutover world: barrier set acquired and held (owner reread under the set), dual approval")
    barrier = _timed(seconds, "barrier_acquire", fa.first_activation_acquire, attempt_key=attempt_key, actor=actor)
    barrier = _timed(seconds, "barrier_hold", fa.first_activation_hold, attempt_key=attempt_key, actor=actor)
    if barrier.state != BarrierSetState.HELD:
        raise ActivationBenchError(f"the barrier set is {barrier.state}: {barrier.release_reason}")
    _timed(seconds, "approval", _approve_activation, epoch.epoch_id, prefix)
    seconds["cutover_world"] = round(time.monotonic() - began, 3)
    seconds["total"] = round(seconds.get("total", 0) + seconds["cutover_world"], 3)
    world.scenario, world.attempt_key, world.barrier_set_pk = "cutover", attempt_key, barrier.pk
    return world


def measure_cutover(accounts: int, *, prefix: str = "", kill_at: str = "before_commit", readback_repeat: int = 10,
                    progress: Progress | None = None, **_ignored) -> ActivationResult:
    """`--scenario cutover`: one `first_activation_commit` killed at `activation.before_commit` (or after the
    gate locks), the raw set-based reference, the timed resume, the readback."""
    say = progress or (lambda _msg: None)
    world = build_cutover_world(accounts, prefix=prefix, progress=say)
    return _measure(world, accounts, "first activation (coordinator resume)", "cutover", kill_at=kill_at,
                    readback_repeat=readback_repeat, say=say)


# -- the successor, with lanes -------------------------------------------------------------------------------------

BULK_LANES_SQL = """
INSERT INTO connector_orderinglane (epoch_id, account_id, route, route_version, partition, contract, baseline,
    baseline_origin, high_water, high_water_tie, active_execution_id, state, halt_reason, gap_since, fence, changed_at)
SELECT %(epoch)s, c.account_id, %(route)s, %(version)s, 'p-' || k, %(contract)s, NULL, 'empty_new_partition',
    CASE WHEN k = %(partitions)s - 1 THEN NULL ELSE (c.ordinal * 10 + k + 1)::numeric END, NULL, NULL, 'open', '',
    NULL, 1 + k, now()
FROM connector_serviceconfigurationaccount c CROSS JOIN generate_series(0, %(partitions)s - 1) k
WHERE c.generation_id = %(configuration)s ORDER BY c.account_id, k
"""
FREEZE_LANES_SQL = """
UPDATE connector_orderinglane SET state = 'halted', halt_reason = %(reason)s, fence = fence + 1, changed_at = now()
WHERE epoch_id = %(epoch)s AND state = 'open'
RETURNING id, account_id, route, route_version, partition, contract, high_water, high_water_tie, fence
"""
SUCCESSOR_LANES_SQL = """
INSERT INTO connector_orderinglane (epoch_id, account_id, route, route_version, partition, contract, baseline,
    baseline_origin, high_water, high_water_tie, active_execution_id, state, halt_reason, gap_since, fence, changed_at)
SELECT %(successor)s, account_id, route, %(version)s, partition, contract, high_water, %(origin)s, high_water,
    high_water_tie, NULL, 'open', '', NULL, 1, now()
FROM connector_orderinglane WHERE epoch_id = %(predecessor)s ORDER BY id
RETURNING id, account_id, route, partition
"""
HANDOFF_AUDIT_SQL = """
INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
    fence, evidence_digest, reason)
SELECT now(), %(actor)s, NULL, 'cutover.OrderingHandoff', h.id::text, 'ordering_handoff', '', '',
    h.predecessor_lane_fence, h.handoff_digest,
    'lane ' || h.predecessor_lane_id || ' frozen at high-water ' || coalesce(h.high_water::text, 'None')
FROM cutover_orderinghandoff h WHERE h.successor_epoch_id = %(successor)s ORDER BY h.id
"""
HANDOFF_COLUMNS = ("barrier_set_id", "predecessor_epoch_id", "successor_epoch_id", "account_id", "predecessor_lane_id",
                   "predecessor_lane_fence", "successor_lane_id", "route", "predecessor_route_version",
                   "successor_route_version", "partition", "contract", "contract_digest", "high_water",
                   "high_water_tie", "derived_from_id", "handoff_digest", "created_at")


def _route_of(epoch, account_id: int):
    from cutover.services import succession

    return succession._route(epoch, account_id, ROUTE)


def _bulk_lanes(world: ActivationWorld, predecessor, partitions: int, say: Progress) -> int:
    """K open lanes per account on the predecessor (module docstring)."""
    route = _route_of(predecessor, min(world.fences))
    _fresh_session()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(BULK_LANES_SQL, {"epoch": predecessor.pk, "route": ROUTE, "version": route.version,
                                        "contract": route.contract, "partitions": partitions,
                                        "configuration": world.configuration_pk})
        lanes = cursor.rowcount
    say(f"  bulk: {lanes:,} predecessor lanes ({partitions} per account, route {ROUTE} v{route.version}, "
        f"{route.contract})")
    return lanes


def _bulk_handoffs(barrier, predecessor, successor, actor_label: str, say: Progress) -> tuple[int, list[int]]:
    """What `ordering_handoff` writes for every predecessor lane, in one transaction (module docstring). Returns
    the handoffs written and every lane id (predecessor and successor)."""
    from django.utils import timezone

    from cutover.models import OrderingHandoff
    from cutover.services import handoff_digests, succession

    template = min(gate_fences(predecessor.configuration_id))
    old, new = _route_of(predecessor, template), _route_of(successor, template)
    digest = succession.contract_digest(contract=old.contract, ordering=old.ordering)
    if digest != succession.contract_digest(contract=new.contract, ordering=new.ordering):
        raise ActivationBenchError("the successor changes the route's ordering contract")
    _fresh_session()
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(FREEZE_LANES_SQL, {"reason": succession.HANDOFF_HALT_REASON, "epoch": predecessor.pk})
        frozen = {(r[1], r[2], r[4]): r for r in cursor.fetchall()}
        cursor.execute(SUCCESSOR_LANES_SQL, {"successor": successor.pk, "version": new.version,
                                             "origin": succession.HANDOFF_BASELINE_ORIGIN,
                                             "predecessor": predecessor.pk})
        staged = {(r[1], r[2], r[3]): r[0] for r in cursor.fetchall()}
        rows = []
        for key, (lane_id, account_id, route, version, partition, contract, high_water, tie, fence) in sorted(
                frozen.items(), key=lambda item: item[1][0]):
            handoff = OrderingHandoff(
                barrier_set_id=barrier.pk, predecessor_epoch_id=predecessor.pk, successor_epoch_id=successor.pk,
                account_id=account_id, predecessor_lane_id=lane_id, predecessor_lane_fence=fence,
                successor_lane_id=staged[key], route=route, predecessor_route_version=version,
                successor_route_version=new.version, partition=partition, contract=contract,
                contract_digest=digest, high_water=high_water, high_water_tie=None if tie is None else bytes(tie),
                derived_from_id=None)
            rows.append(tuple(getattr(handoff, c) for c in HANDOFF_COLUMNS[:-2])
                        + (handoff_digests.digest_of_handoff(handoff), now))
        handoffs = _copy(cursor, "cutover_orderinghandoff", HANDOFF_COLUMNS, rows)
        cursor.execute(HANDOFF_AUDIT_SQL, {"actor": actor_label, "successor": successor.pk})
        audits = cursor.rowcount
    if not handoffs == audits == len(frozen) == len(staged):
        raise ActivationBenchError(f"handoffs {handoffs}, audit rows {audits}, frozen {len(frozen)}, staged "
                                   f"{len(staged)}")
    say(f"  bulk: {handoffs:,} ordering handoffs ({len(staged):,} successor lanes, {audits:,} audit rows)")
    return handoffs, sorted([r[0] for r in frozen.values()] + list(staged.values()))


def _service_handoffs(barrier, predecessor, successor, actor) -> tuple[int, list[int]]:
    """--handoffs service: `succession_phases.handoff_all` (one `ordering_handoff` transaction per lane)."""
    from connector.models import OrderingLane
    from cutover.services import succession_phases

    outcome = succession_phases.handoff_all(barrier_set=barrier, actor=actor)
    if not outcome.complete:
        raise ActivationBenchError(f"handoff_all refused: {outcome.refused[:5]}")
    lanes = OrderingLane.objects.filter(epoch_id__in=(predecessor.pk, successor.pk)).values_list("pk", flat=True)
    return outcome.done, sorted(lanes)


def build_successor_world(accounts: int, *, prefix: str = "", progress: Progress | None = None,
                          partitions: int = DEFAULT_PARTITIONS, handoffs: str = "bulk") -> ActivationWorld:
    """The world just before `successor_activate`, with K lanes per account handed off (module docstring), in bulk
    or, with handoffs="service", through `succession_phases.handoff_all`."""
    from connector.actors import Actor
    from connector.choices import EpochState
    from connector.models import AccountServingGate
    from connector.services import serving
    from cutover.services import succession, succession_phases

    say = progress or (lambda _msg: None)
    actor = Actor.system(ACTOR)
    world = build_activation_world(accounts, prefix=prefix, progress=say)
    seconds, began = world.setup_seconds, time.monotonic()
    say("  successor world: first activation (epoch_activate_first)")
    predecessor = _timed(seconds, "first_activation", serving.epoch_activate_first, epoch_pk=world.epoch_pk,
                         actor=actor)
    if predecessor.state != EpochState.ACTIVE:
        raise ActivationBenchError(f"the first activation did not commit: {predecessor.state}")
    if partitions:
        _timed(seconds, "lanes", _bulk_lanes, world, predecessor, partitions, say)
    say("  successor world: successor epoch prepared and verified from the same configuration")
    successor = _timed(seconds, "successor_prepare", serving.epoch_prepare_from_owners,
                       epoch_id=f"{prefix}activation-epoch-2",
                       configuration_generation_id=world.configuration_generation_id, actor=actor)
    successor = _timed(seconds, "successor_verify", serving.epoch_verify, epoch_pk=successor.pk, actor=actor)
    if successor.state != EpochState.VERIFIED:
        raise ActivationBenchError(f"successor verification refused: {successor.rejection_code} "
                                   f"{successor.rejection_detail}")
    say(f"  successor world: halting {accounts:,} gates (succession_phases.halt_all)")
    _fresh_session()
    halted = _timed(seconds, "halt_gates", succession_phases.halt_all, predecessor=predecessor, actor=actor)
    if not halted.complete:
        raise ActivationBenchError(f"halt_all refused: {halted.refused[:5]}")
    say("  successor world: barrier set acquired and held")
    barrier = _timed(seconds, "barrier_acquire", succession.barrier_set_acquire,
                     predecessor_epoch_id=predecessor.epoch_id, successor_epoch_id=successor.epoch_id,
                     holder=ACTOR, actor=actor)
    barrier = _timed(seconds, "barrier_hold", succession.barrier_set_hold, barrier_set_pk=barrier.pk,
                     expected_fence=barrier.fence, actor=actor)
    if handoffs not in HANDOFF_PATHS:
        raise ActivationBenchError(f"handoffs {handoffs!r} is not one of {', '.join(HANDOFF_PATHS)}")
    written, lane_pks = 0, []
    if partitions and handoffs == "service":
        say("  successor world: ordering handoffs through succession_phases.handoff_all")
        written, lane_pks = _timed(seconds, "handoffs", _service_handoffs, barrier, predecessor, successor, actor)
    elif partitions:
        written, lane_pks = _timed(seconds, "handoffs", _bulk_handoffs, barrier, predecessor, successor,
                                   str(actor), say)
    _timed(seconds, "analyze_after_halt", _analyze)
    gates = gate_fences(world.configuration_pk)
    not_halted = [a for a, (mode, _fence, epoch_pk, _digest) in gates.items()
                  if mode != "v2_halted" or epoch_pk != predecessor.pk]
    if len(gates) != accounts or not_halted:
        raise ActivationBenchError(f"{len(gates)} gates, not v2_halted on the predecessor: {not_halted[:10]}")
    if AccountServingGate.objects.filter(epoch_id=successor.pk).exists():
        raise ActivationBenchError("a gate already names the successor")
    seconds["successor_world"] = round(time.monotonic() - began, 3)
    seconds["total"] = round(seconds.get("total", 0) + seconds["successor_world"], 3)
    world.scenario, world.gate_mode_before = "successor", "v2_halted"
    world.predecessor_pk, world.barrier_set_pk, world.handoffs = predecessor.pk, barrier.pk, written
    world.epoch_pk, world.epoch_digest, world.lane_pks = successor.pk, bytes(successor.digest), lane_pks
    world.fences = {a: fence for a, (_mode, fence, *_rest) in gates.items()}
    return world


def measure_successor(accounts: int, *, prefix: str = "", kill_at: str = "before_commit", readback_repeat: int = 10,
                      progress: Progress | None = None, partitions: int = DEFAULT_PARTITIONS,
                      handoffs: str = "bulk", **_ignored) -> ActivationResult:
    """`--scenario successor`: `successor_activate` on `build_successor_world` (K lanes per account handed off):
    one attempt killed at `succession.before_commit` (or after the gate locks), the raw set-based reference
    (the lane lock and the gate statement), the timed retry, the readback."""
    say = progress or (lambda _msg: None)
    world = build_successor_world(accounts, prefix=prefix, progress=say, partitions=partitions, handoffs=handoffs)
    return _measure(world, accounts, "successor activation", "successor", kill_at=kill_at,
                    readback_repeat=readback_repeat, say=say)
