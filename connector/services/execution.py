"""Runs and results: the claimant's write paths after the claim (the lane and window steps are in
`services.advance`, the claims in `services.claims`; both are re-exported here).

- `execution_run` submits the command with its ExecutionRef to Runtime and records the result.
- `execution_record_result` closes the Execution from the Runtime result receipt only, and advances the lane
  high-water in the same fenced transaction (CV2-06-014, CV2-07, CV2-08).
"""
from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.db.models import F, FilteredRelation, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from connector import locks, logcontext, stage_metrics, tracing
from connector.choices import ExecutionState, LaneState, SweepStep
from connector.errors import ConnectorError, FenceStale, TransitionRefused
from connector.faults import fault_point
from connector.models import Execution, ExecutionTrace
from connector.selectors.routes import route_for
from connector.services import poison, runtime
from connector.services.audit import audit_record
from connector.services.guard import ServingContext, lock_serving, lock_serving_accounts

log = logging.getLogger(__name__)

# Re-exported: the lane and window steps and the claims moved to their own modules (D-260); callers and tests
# keep using `execution.<name>`.
from connector.services.advance import (  # noqa: E402,F401
    DEFAULT_GAP_DEADLINE_SECONDS,
    DEFAULT_SETTLE_SECONDS,
    lane_advance,
    lane_gap_deadline,
    lane_row,
    lanes_advance,
    window_seal_due,
)
from connector.services.claims import (  # noqa: E402,F401
    CLAIMANT,
    ClaimToken,
    execution_claim,
    execution_claim_batch,
)


def execution_claim_batch_and_run(*, holder: str, n: int, lease_seconds: int = 60,
                                  account_ids: list[int] | None = None) -> list[Execution]:
    """One worker step over a batch, the one claim-and-run path (D-503): claim up to `n` Executions
    (`execution_claim_batch`, which isolates an Execution whose claim fails by splitting the batch), then run them
    through `execution_run_batch` (one Runtime transaction and one completion transaction for the batch's common
    case, D-254..D-256; the per-item step `_run_one` for whatever the batch leaves, where a deterministic failure
    quarantines that Execution only, EXECUTION_STEP_FAILED, and a transient one leaves it leased). A crash loses only
    what was not committed: the leases of the batch's unrun Executions expire and they are claimed again with a new
    fence. Returns the Executions it ran (completed, quarantined or left ready by a transient failure); empty when
    nothing was claimable or the claim was refused or deferred."""
    try:
        tokens = execution_claim_batch(holder=holder, n=n, lease_seconds=lease_seconds, account_ids=account_ids)
    except Exception as exc:  # noqa: BLE001 - nothing was written; the next step retries
        poison.log_fallback(log, exc, "execution_claim_batch of %d deferred", n)
        return []
    if tracing.enabled():
        # Traced, each Execution keeps its own `execution_run` span and trace links: the per-item step (D-480).
        return [_run_one(token) for token in tokens]
    return execution_run_batch(tokens=tokens)


def execution_run(*, token: ClaimToken) -> Execution:
    """Submit the claimed command to Runtime (its own transaction) and record the result. Safe to repeat.

    The token's lease fence is compared twice: before Runtime (a holder whose lease was already taken over does
    not call Runtime) and under the Execution's row lock at completion (`execution_record_result(lease_fence=)`):
    a stale fence never completes the Execution (FENCE_STALE, retryable; the newer holder completes it). The
    token's account (when it carries one) is named by the read, its projection's too (docs/scale-out.md)."""
    executions = Execution.objects.select_related("projection")
    if token.account_id is not None:
        executions = executions.filter(account_id=token.account_id, projection__account_id=token.account_id)
    execution = executions.get(pk=token.execution_pk)
    logcontext.note(account_id=execution.account_id)
    if execution.state == ExecutionState.READY and execution.lease_fence != token.lease_fence:
        raise FenceStale(f"execution {execution.pk} lease fence is {execution.lease_fence}, the claim holds "
                         f"{token.lease_fence}")
    receipt = runtime.runtime_command_apply(command_id=execution.command_id,
                                            execution_ref=bytes(execution.execution_ref),
                                            input=bytes(execution.projection.input), account_id=execution.account_id,
                                            execution_id=execution.pk)
    fault_point("runtime.after_commit")
    return execution_record_result(execution_pk=execution.pk, command_id=receipt.command_id,
                                   execution_ref_digest=receipt.execution_ref_digest, lease_fence=token.lease_fence,
                                   account_id=execution.account_id)


def execution_claim_and_run(*, holder: str, lease_seconds: int = 60) -> Execution | None:
    """One worker step: claim one ready Execution and run it. A deterministic failure of the run (any exception
    but a transient one: Runtime and the result are pure functions of immutable inputs, so even a domain refusal
    repeats) quarantines that Execution with EXECUTION_STEP_FAILED and returns it, so the worker moves on; a
    transient one leaves it leased (the lease expires and it is claimed again). None when nothing is claimable."""
    token = execution_claim(holder=holder, lease_seconds=lease_seconds)
    if token is None:
        return None
    return _run_one(token)


def _execution_for_result(execution_pk: int, account_id: int | None) -> Execution:
    """The Execution with its epoch and projection, and the admission time (its event's receipt, or its window's
    opening) in the same statement (issue 21: the admission -> result latency). With the account, every joined
    table names it (the joins of event, receipt and window carry `account_id = ` it), so the read is routed to the
    account's shard (docs/scale-out.md); without it, the Execution is read by its pk alone."""
    executions = Execution.objects.select_related("epoch", "projection").defer("epoch__preimage")
    if account_id is None:
        return (executions.annotate(admitted_at=Coalesce(F("projection__event__receipt__created_at"),
                                                         F("projection__window__opened_at")))
                .get(pk=execution_pk))
    return (executions.filter(account_id=account_id, projection__account_id=account_id)
            .annotate(routed_event=FilteredRelation("projection__event",
                                                    condition=Q(projection__event__account_id=account_id)),
                      routed_receipt=FilteredRelation("routed_event__receipt",
                                                      condition=Q(routed_event__receipt__account_id=account_id)),
                      routed_window=FilteredRelation("projection__window",
                                                     condition=Q(projection__window__account_id=account_id)))
            .annotate(admitted_at=Coalesce(F("routed_receipt__created_at"), F("routed_window__opened_at")))
            .get(pk=execution_pk))



def close_from_result(execution: Execution, result, ctx: ServingContext, *, channel: str) -> None:
    """Under the route's frozen terminal-disposition policy, complete the locked Execution from its Runtime result
    receipt or quarantine it (`RESULT_<OUTCOME>`): the one decision both the per-item and the batched recording
    take (the caller saves or writes the row)."""
    route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=execution.account_id,
                      channel=channel)
    if route.terminal_disposition(result.outcome) == "advance":
        execution.complete(outcome=result.outcome, result_digest=result.result_digest, runtime_receipt=result.receipt)
    else:
        execution.quarantine(reason=f"RESULT_{result.outcome.upper()}", outcome=result.outcome,
                             result_digest=result.result_digest, runtime_receipt=result.receipt)

def execution_record_result(*, execution_pk: int, command_id: str, execution_ref_digest: bytes,
                            lease_fence: int | None = None, account_id: int | None = None) -> Execution:
    """Close an Execution from the Runtime result receipt (read back from Runtime, never from the caller's
    word), and under the route's frozen terminal-disposition policy either complete it and advance the lane
    high-water, or quarantine it and halt the partition, in one fenced transaction. Idempotent.

    `lease_fence` (a claim holder's token): the Execution's current lease fence must equal it under the row lock
    (lease compare-and-swap, CV2-07-018), else FenceStale and nothing is written. Without it (recovery from a
    stored Runtime result receipt, which is not a re-execution) no lease is compared. `account_id`: the
    Execution's account as the caller read it; every read and lock then names it (docs/scale-out.md)."""
    execution = _execution_for_result(execution_pk, account_id)
    projection = execution.projection  # immutable: the locked row below names the same one
    admitted_at, windowed = execution.admitted_at, projection.window_id is not None
    if execution.command_id != command_id:
        raise TransitionRefused("the result names another command")
    result = runtime.runtime_result_get(command_id=command_id, execution_ref_digest=execution_ref_digest)
    if result is None or bytes(execution.execution_ref_digest) != bytes(execution_ref_digest):
        raise TransitionRefused("no Runtime result receipt for this exact command and ExecutionRef")
    with transaction.atomic():
        ctx = lock_serving(account_id=execution.account_id, epoch_id=execution.epoch.epoch_id,
                           epoch_digest=bytes(execution.epoch.digest), settling=True)
        account = execution.account_id
        lane = locks.lane_for_update(execution.lane_id, account_id=account) if execution.lane_id else None
        execution = locks.execution_for_update(execution_pk, account_id=account)
        if execution.projection_id == projection.pk:
            execution.projection = projection  # no second read of it
        if execution.state in (ExecutionState.COMPLETED, ExecutionState.QUARANTINED):
            return execution
        if execution.state != ExecutionState.READY:
            raise TransitionRefused(f"execution is {execution.state}")
        if lease_fence is not None and execution.lease_fence != lease_fence:
            raise FenceStale(f"execution {execution_pk} lease fence is {execution.lease_fence}, the holder's is "
                             f"{lease_fence}")
        close_from_result(execution, result, ctx, channel=execution.projection.route)
        execution.save()
        stage_metrics.result_recorded(admitted_at=admitted_at, committed_at=result.committed_at,
                                      window=windowed, outcome=result.outcome)
        audit_record(actor=CLAIMANT, entity=execution, action="execution_record_result",
                     from_state=ExecutionState.READY, to_state=execution.state,
                     evidence_digest=bytes(result.result_digest), reason=result.outcome)
        if lane is not None:
            position = execution.projection.position
            if execution.state == ExecutionState.COMPLETED:
                high = position if lane.high_water is None or position > lane.high_water else lane.high_water
                lane_row(lane).update(
                    high_water=high, high_water_tie=execution.projection.tie_breaker, active_execution=None,
                    fence=lane.fence + 1)
            else:
                lane_row(lane).update(active_execution=None, state=LaneState.HALTED,
                                                               halt_reason=execution.quarantine_reason,
                                                               fence=lane.fence + 1)
        fault_point("result.before_commit")
        return execution


# -- the batch run (issue 18 goal 3, D-254..D-256) -------------------------------------------------------------

@dataclass(frozen=True)
class ResultToRecord:
    """What `execution_record_result` takes for one Execution: its command, the ExecutionRef digest of the
    Runtime result receipt and the claim holder's lease fence."""

    execution_pk: int
    command_id: str
    execution_ref_digest: bytes
    lease_fence: int | None


# The batch's completions in one statement (D-255): every Execution moves from `ready` (compared again in the
# UPDATE: a second line of defence, as django-fsm's ConcurrentTransitionMixin adds it), one audit row each, in
# the batch's order, and each lane closes (high-water, tie, no active Execution, fence + 1; or halted). The row
# triggers (transition table, immutable columns, a high-water that never decreases) fire per row.
_RECORD_RESULTS_SQL = """
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(accounts)s::bigint[], %(states)s::text[], %(outcomes)s::text[],
                         %(digests)s::bytea[], %(receipts)s::bytea[], %(reasons)s::text[])
        WITH ORDINALITY AS d(id, account_id, state, outcome, result_digest, receipt, reason, ord)
), done AS (
    UPDATE connector_execution e
       SET state = d.state, result_outcome = d.outcome, result_digest = d.result_digest, runtime_receipt = d.receipt,
           quarantine_reason = CASE WHEN d.state = 'quarantined' THEN d.reason ELSE e.quarantine_reason END,
           lease_holder = '', lease_expires_at = NULL, changed_at = %(now)s
      FROM d
     WHERE e.id = d.id AND e.account_id = d.account_id AND e.state = 'ready'
 RETURNING e.id
), audit AS (
    INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state,
                                       to_state, fence, evidence_digest, reason)
    SELECT %(now)s, %(actor)s, NULL, %(entity_type)s, d.id::text, 'execution_record_result', 'ready', d.state, NULL,
           d.result_digest, d.outcome
      FROM d ORDER BY d.ord
 RETURNING id
), lanes AS (
    UPDATE connector_orderinglane l
       SET high_water = CASE WHEN u.halted THEN l.high_water ELSE u.high_water END,
           high_water_tie = CASE WHEN u.halted THEN l.high_water_tie ELSE u.tie END,
           active_execution_id = NULL,
           state = CASE WHEN u.halted THEN %(halted)s ELSE l.state END,
           halt_reason = CASE WHEN u.halted THEN u.halt_reason ELSE l.halt_reason END,
           fence = l.fence + 1
      FROM unnest(%(lane_ids)s::bigint[], %(lane_accounts)s::bigint[], %(lane_halted)s::boolean[],
                  %(lane_high)s::numeric[], %(lane_ties)s::bytea[], %(lane_reasons)s::text[])
           AS u(id, account_id, halted, high_water, tie, halt_reason)
     WHERE l.id = u.id AND l.account_id = u.account_id
 RETURNING l.id
)
SELECT (SELECT count(*) FROM done), (SELECT count(*) FROM audit), (SELECT count(*) FROM lanes)"""


def _batch_executions(pks, *, with_input: bool = False):
    """The Executions of a batch in one read: the columns the batch run and the batch recording compare (never the
    epoch's preimage), the projection's input if asked, and the admission time (issue 21: the stage latency)."""
    columns = ["id", "account_id", "epoch_id", "lane_id", "projection_id", "command_id", "execution_ref_digest",
               "state", "lease_fence", "epoch__epoch_id", "epoch__digest", "epoch__state", "projection__route",
               "projection__position", "projection__tie_breaker", "projection__window_id"]
    if with_input:
        columns += ["execution_ref", "projection__input"]
    return {e.pk: e for e in Execution.objects.filter(pk__in=sorted(set(pks))).select_related("epoch", "projection")
            .only(*columns).annotate(admitted_at=Coalesce(F("projection__event__receipt__created_at"),
                                                          F("projection__window__opened_at")))}


def execution_record_results(*, items: list[ResultToRecord], executions: dict | None = None) -> dict[int, Execution]:
    """`execution_record_result` for a batch, in one fenced transaction (D-255): the same checks and the same
    writes, in a constant number of statements for the batch.

    Before the transaction: the Executions (one read, preimage never loaded; `executions`, the batch run's own
    read of the same rows, saves it: only their immutable columns are used before the row lock) and their Runtime result receipts
    (read back from Runtime: `runtime.runtime_results_get`, one read). In the transaction: every account's epoch
    and gate FOR SHARE in ascending account id (`lock_serving_accounts(settling=True)`, one round trip), each
    Execution's exact epoch (pk, ID and digest) checked against what its account's guard locked; the lanes
    FOR UPDATE (ascending pk), then the Executions FOR UPDATE (ascending pk) (docs/locking.md); under the lock each
    Execution's lease fence is compared with its holder's; then every completion or quarantine (the route's frozen
    terminal disposition), its audit row and its lane's high-water or halt in one statement.

    Returns the Executions this call settled (completed or quarantined now, or already closed before: idempotent),
    by pk. Every other item is left untouched for the per-item `execution_record_result`, which decides it exactly
    as before: a stale lease fence (FENCE_STALE: the newer holder completes it), a refused guard or another epoch,
    a missing or mismatched result receipt, a state other than ready, two items of one lane. If the transaction
    fails for any reason it rolls back and returns {} (every item takes the per-item path).
    `fault_point("result.batch_before_commit")` fires before the COMMIT."""
    if not items:
        return {}
    by_pk = {i.execution_pk: i for i in items}
    try:
        known = executions or {}
        rows = [known[pk] for pk in sorted(by_pk) if pk in known]
        if len(rows) != len(by_pk):
            rows = list(_batch_executions(by_pk).values())
        results = runtime.runtime_results_get(command_ids=[i.command_id for i in items])
        candidates, lanes_seen = [], set()
        for ex in rows:
            item = by_pk[ex.pk]
            result = results.get(item.command_id)
            if (ex.command_id != item.command_id or result is None
                    or not hmac.compare_digest(bytes(result.execution_ref_digest), bytes(item.execution_ref_digest))
                    or not hmac.compare_digest(bytes(ex.execution_ref_digest), bytes(item.execution_ref_digest))):
                continue  # the per-item path refuses it (TransitionRefused / RuntimeResultMismatch)
            if ex.lane_id is not None:
                if ex.lane_id in lanes_seen:
                    continue
                lanes_seen.add(ex.lane_id)
            candidates.append((ex, item, result))
        if not candidates:
            return {}
        return _record_batch(candidates)
    except Exception as exc:  # noqa: BLE001 - rolled back as a whole; every item takes the per-item path
        poison.log_fallback(log, exc, "execution_record_results: batch of %d rolled back; per-item path", len(items))
        return {}


def _record_batch(candidates: list) -> dict[int, Execution]:
    settled: dict[int, Execution] = {}
    accounts = sorted({ex.account_id for ex, _, _ in candidates})
    with transaction.atomic(durable=True):
        guarded = lock_serving_accounts(account_ids=accounts, settling=True)
        served = []
        for ex, item, result in candidates:
            if not isinstance(guarded[ex.account_id], ServingContext):
                continue
            try:  # the memoized rows: no round trip; the exact epoch ID and digest of this Execution
                ctx = lock_serving(account_id=ex.account_id, epoch_id=ex.epoch.epoch_id,
                                   epoch_digest=bytes(ex.epoch.digest), settling=True)
            except ConnectorError:
                continue
            if ctx.epoch_pk != ex.epoch_id:
                continue
            served.append((ex, item, result, ctx))
        if not served:
            return {}
        lanes = locks.lanes_for_update([ex.lane_id for ex, *_ in served if ex.lane_id is not None],
                                       account_ids=accounts)
        locked = locks.executions_for_update([ex.pk for ex, *_ in served], account_ids=accounts)
        now = timezone.now()
        rows, lane_rows, metrics = [], [], []
        for ex, item, result, ctx in served:
            current = locked.get(ex.pk)
            if current is None:
                continue
            if current.state in (ExecutionState.COMPLETED, ExecutionState.QUARANTINED):
                settled[ex.pk] = current  # recorded before: idempotent
                continue
            if current.state != ExecutionState.READY:
                continue
            if item.lease_fence is not None and current.lease_fence != item.lease_fence:
                continue  # stale holder: never completes it (CV2-07-018); the per-item path raises FENCE_STALE
            lane = lanes.get(ex.lane_id) if ex.lane_id is not None else None
            if ex.lane_id is not None and lane is None:
                continue
            close_from_result(current, result, ctx, channel=ex.projection.route)
            current.changed_at = now
            rows.append(current)
            metrics.append((ex.admitted_at, result.committed_at, ex.projection.window_id is not None,
                            result.outcome))
            if lane is not None:
                position = ex.projection.position
                if current.state == ExecutionState.COMPLETED:
                    high = position if lane.high_water is None or position > lane.high_water else lane.high_water
                    lane_rows.append((lane.pk, lane.account_id, False, high, ex.projection.tie_breaker, ""))
                else:
                    lane_rows.append((lane.pk, lane.account_id, True, None, None, current.quarantine_reason))
        if rows:
            with transaction.get_connection().cursor() as cursor:
                cursor.execute(_RECORD_RESULTS_SQL, {
                    "now": now, "actor": str(CLAIMANT), "entity_type": Execution._meta.label,
                    "halted": LaneState.HALTED,
                    "ids": [e.pk for e in rows], "accounts": [e.account_id for e in rows],
                    "states": [e.state for e in rows], "outcomes": [e.result_outcome for e in rows],
                    "digests": [bytes(e.result_digest) for e in rows],
                    "receipts": [bytes(e.runtime_receipt) for e in rows],
                    "reasons": [e.quarantine_reason for e in rows],
                    "lane_ids": [r[0] for r in lane_rows], "lane_accounts": [r[1] for r in lane_rows],
                    "lane_halted": [r[2] for r in lane_rows], "lane_high": [r[3] for r in lane_rows],
                    "lane_ties": [None if r[4] is None else bytes(r[4]) for r in lane_rows],
                    "lane_reasons": [r[5] for r in lane_rows]})
                counts = tuple(int(x) for x in cursor.fetchone())
            if counts != (len(rows), len(rows), len(lane_rows)):
                raise AssertionError(f"batch completion wrote {counts}, expected "
                                     f"{(len(rows), len(rows), len(lane_rows))}")
            for admitted_at, committed_at, windowed, outcome in metrics:
                stage_metrics.result_recorded(admitted_at=admitted_at, committed_at=committed_at, window=windowed,
                                              outcome=outcome)
            settled.update({e.pk: e for e in rows})
        fault_point("result.batch_before_commit")
    return settled


def _run_one(token: ClaimToken) -> Execution:
    """The per-item step of every claim path (one claim, a batch's leftovers, a traced batch): the run under poison
    isolation, in the `execution_run` span continuing the Execution's stored trace (issue 21)."""
    ran = None
    with tracing.stage("execution_run", ExecutionTrace, execution_id=token.execution_pk,
                       log={"execution_id": token.execution_pk}), \
            poison.isolated(step=SweepStep.EXECUTION_RUN, item=f"execution {token.execution_pk}",
                            quarantine=partial(poison.execution_quarantine, execution_pk=token.execution_pk,
                                               step=SweepStep.EXECUTION_RUN), refusals_quarantine=True):
        ran = execution_run(token=token)
    return ran if ran is not None else Execution.objects.get(pk=token.execution_pk)


def execution_run_batch(*, tokens: list[ClaimToken]) -> list[Execution]:
    """Run a claimed batch (D-254..D-256): one read of the claimed Executions; one Runtime transaction applying
    every common-case command and committing its ApplicationResult with it (`runtime.runtime_commands_apply`);
    one fenced transaction completing them from the read-back result receipts (`execution_record_results`).
    Whatever the batch path leaves (a stale lease fence, a windowed or pushing route, an unusual input, a refused
    guard, any failure of either batch transaction, which then rolled back) runs through the per-item step
    (`execution_run` under poison isolation), which is the one semantics. Returns the Executions in token order.

    Crash points: `runtime.batch_before_commit` (Runtime's batch not committed: nothing of it stands),
    `runtime.batch_after_commit` (ApplicationResults and CRM changes committed, nothing recorded: the stored
    results close them later without a second application), `result.batch_before_commit` (completions not
    committed)."""
    if not tokens:
        return []
    rows = _batch_executions([t.execution_pk for t in tokens], with_input=True)
    mine = [t for t in tokens if (e := rows.get(t.execution_pk)) is not None and e.state == ExecutionState.READY
            and e.lease_fence == t.lease_fence]
    receipts = runtime.runtime_commands_apply(commands=[
        runtime.RuntimeCommand(command_id=rows[t.execution_pk].command_id,
                               execution_ref=bytes(rows[t.execution_pk].execution_ref),
                               input=bytes(rows[t.execution_pk].projection.input),
                               account_id=rows[t.execution_pk].account_id, execution_id=t.execution_pk)
        for t in mine]) if mine else {}
    fault_point("runtime.batch_after_commit")
    applied = [ResultToRecord(t.execution_pk, r.command_id, r.execution_ref_digest, t.lease_fence)
               for t in mine if (r := receipts.get(rows[t.execution_pk].command_id)) is not None]
    settled = execution_record_results(items=applied, executions=rows)
    return [settled[t.execution_pk] if t.execution_pk in settled else _run_one(t) for t in tokens]
