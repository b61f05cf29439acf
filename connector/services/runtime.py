"""Runtime: the application side. It commits the CRM mutation and the immutable ApplicationResult in one
transaction; the same command + ExecutionRef digest returns the stored result, and a mismatched digest fails
closed (CV2-08). It resolves everything through the frozen epoch named in the ExecutionRef."""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.backends.signals import connection_created
from django.utils import timezone

from connector.canonical.decoding import decode
from connector.canonical.encoding import encode
from connector import hooks, tracing
from connector.faults import fault_point
from connector.errors import ApplicationItemRejected, ConnectorError
from connector.interpreters.inbound import BodyUnparseable, resolve_pointer
from connector.models import ApplicationResult, ConnectorAccount, CrmRecord, ServingEpoch
from connector.receipts import rec
from connector.selectors.routes import mapping_for, route_for
from connector.services import poison
from connector.services.guard import lock_serving, lock_serving_accounts

RESULT_RECEIPT_PROTOCOL = "nexuscrm.runtime.result-receipt.v1"


class RuntimeResultMismatch(ConnectorError):
    """A command ID was presented with a different ExecutionRef digest: indistinguishable from a missing result."""

    code = "RUNTIME_RESULT_MISMATCH"
    http_status = 409
    operator_action = "Quarantine: the command identity and its ExecutionRef disagree."


@dataclass(frozen=True)
class ResultReceipt:
    command_id: str
    execution_ref_digest: bytes
    outcome: str
    result_digest: bytes
    receipt: bytes
    committed_at: datetime | None = None  # the ApplicationResult's commit time (issue 21: the stage latency)


def _receipt(result: ApplicationResult) -> ResultReceipt:
    return ResultReceipt(result.command_id, bytes(result.execution_ref_digest), result.outcome,
                         bytes(result.result_digest), bytes(result.receipt), result.committed_at)


def runtime_result_get(*, command_id: str, execution_ref_digest: bytes) -> ResultReceipt | None:
    """Query a command's stored result; a digest mismatch fails closed."""
    result = ApplicationResult.objects.filter(command_id=command_id).first()
    if result is None:
        return None
    if not hmac.compare_digest(bytes(result.execution_ref_digest), bytes(execution_ref_digest)):
        raise RuntimeResultMismatch(f"command {command_id} is bound to another ExecutionRef")
    return _receipt(result)


def ctx_account_key(account_id: int) -> str:
    return ConnectorAccount.objects.values_list("account_key", flat=True).get(pk=account_id)


def _apply_record(account_id: int, record_key: str, values: dict, command_id: str) -> str:
    if "email" in values and "@" not in str(values["email"]):
        return "rejected"
    record = CrmRecord.objects.select_for_update().filter(account_id=account_id, record_key=record_key).first()
    if record is None:
        CrmRecord.objects.create(account_id=account_id, record_key=record_key, fields=values, version=1,
                                 last_command_id=command_id)
        return "applied"
    merged = {**record.fields, **values}
    if merged == record.fields:
        return "noop"
    CrmRecord.objects.filter(pk=record.pk).update(fields=merged, version=record.version + 1,
                                                  last_command_id=command_id)
    return "applied"


@tracing.traced("runtime_command_apply")
def runtime_command_apply(*, command_id: str, execution_ref: bytes, input: bytes, account_id: int,
                          execution_id: int | None = None) -> ResultReceipt:
    """Apply one command exactly once. Repeating it (after a lost response, a lease expiry) returns the stored
    result without applying anything again. `execution_id` names the Execution that submits the command; every
    OutboundCommand this transaction authors records it as its source execution.

    An item whose outbound intent the author hook refuses with ApplicationItemRejected (e.g. OUTBOUND_PATH_UNSAFE)
    is recorded `rejected:<code>` and keeps nothing: its CRM change and its command share one savepoint, so the
    mutation never commits without its outbox intent (D-172). The other items apply as usual."""
    ref_digest = hashlib.sha256(bytes(execution_ref)).digest()
    found = runtime_result_get(command_id=command_id, execution_ref_digest=ref_digest)
    if found is not None:
        return found
    _, ref = decode(bytes(execution_ref))
    fields = dict(ref)
    # Only the columns the guard compares (and the FSM state, which django-fsm reads on load): the preimage grows
    # with the service and stays on disk (D-251).
    epoch = ServingEpoch.objects.filter(digest=fields["epoch_digest"]).only("id", "epoch_id", "digest", "state").first()
    if epoch is None:
        raise RuntimeResultMismatch("the ExecutionRef names no exact epoch")
    route = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=account_id,
                      channel=fields["route"])
    mapping = mapping_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), business_key=route.mapping_key) \
        if route.mapping_key else None
    data = json.loads(bytes(input))
    items = data["members"] if "members" in data else [data]
    suppress = bool(fields.get("suppress_external_effects"))
    pushes = bool(route.definition.get("push")) and not suppress
    try:
        with transaction.atomic():
            # Outbound authoring happens in this application transaction under the serving guard (CV2-10-005).
            ctx = lock_serving(account_id=account_id, epoch_id=epoch.epoch_id,
                               epoch_digest=bytes(epoch.digest)) if pushes else None
            outcomes = []
            for item in items:
                try:
                    values = ({target: resolve_pointer(item["data"], source) for source, target in mapping}
                              if mapping else dict(item["data"]))
                except BodyUnparseable:
                    outcomes.append("rejected")
                    continue
                if not item.get("record_key"):
                    outcomes.append("rejected")
                    continue
                try:
                    with transaction.atomic() if pushes else nullcontext():
                        outcome_item = _apply_record(account_id, item["record_key"], values, command_id)
                        if pushes and outcome_item == "applied":
                            hooks.author_outbound([dict(
                                ctx=ctx, account_key=ctx_account_key(account_id), route_definition=route.definition,
                                command_id=command_id, record_key=item["record_key"], fields=values,
                                suppress_external_effects=suppress, execution_id=execution_id)])
                except ApplicationItemRejected as exc:
                    outcome_item = f"rejected:{exc.code}"
                outcomes.append(outcome_item)
            # A failed item fails the command (decision 6 quarantines it by default); else the best item outcome.
            outcome = ("failed" if "failed" in outcomes else "applied" if "applied" in outcomes
                       else "noop" if "noop" in outcomes else "rejected")
            result_digest = hashlib.sha256(encode(RESULT_RECEIPT_PROTOCOL + "/result", rec(
                command_id=command_id, outcome=outcome, items=list(outcomes)))).digest()
            receipt = encode(RESULT_RECEIPT_PROTOCOL, rec(command_id=command_id, execution_ref_digest=ref_digest,
                                                          outcome=outcome, result_digest=result_digest))
            pending = ApplicationResult.objects.create(
                command_id=command_id, execution_ref_digest=ref_digest, outcome=outcome, result_digest=result_digest,
                receipt=receipt, detail=",".join(outcomes))
            return _receipt(pending)
    except IntegrityError:  # a concurrent apply of the same command committed first
        found = runtime_result_get(command_id=command_id, execution_ref_digest=ref_digest)
        if found is None:
            raise
        return found


# -- the batch path (issue 18 goal 3, D-254) -------------------------------------------------------------------

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeCommand:
    """One claimed command as `runtime_command_apply` takes it."""

    command_id: str
    execution_ref: bytes
    input: bytes
    account_id: int
    execution_id: int | None = None


@dataclass
class _Planned:
    command: RuntimeCommand
    ref_digest: bytes
    record_key: str
    values: dict
    epoch: ServingEpoch | None = None
    push: dict | None = None  # the route's frozen definition when its applied change authors outbound (D-293)


# The CrmRecords of a batch, locked FOR UPDATE in one statement in the canonical order of the table's unique key
# (account id, then record key), so two batches that share records meet them in the same order.
_CRM_LOCK_SQL = """
SELECT r.id, r.account_id, r.record_key, r.fields::text, r.version
  FROM connector_crmrecord r
  JOIN unnest(%(accounts)s::bigint[], %(keys)s::text[]) AS k(account_id, record_key)
    ON r.account_id = k.account_id AND r.record_key = k.record_key
 ORDER BY r.account_id, r.record_key
   FOR UPDATE OF r"""

# The batch's application writes in one statement: changed records updated, new records inserted (ascending key),
# one ApplicationResult per command (a command applied concurrently elsewhere violates the unique command ID, and
# the whole statement, hence the transaction, fails: the caller falls back to the per-command path).
_APPLY_SQL = """
WITH upd AS (
    UPDATE connector_crmrecord r
       SET fields = u.fields::jsonb, version = r.version + 1, last_command_id = u.command_id, updated_at = %(now)s
      FROM unnest(%(u_ids)s::bigint[], %(u_accounts)s::bigint[], %(u_fields)s::text[], %(u_commands)s::text[])
           AS u(id, account_id, fields, command_id)
     WHERE r.id = u.id AND r.account_id = u.account_id
 RETURNING r.id
), ins AS (
    INSERT INTO connector_crmrecord (account_id, record_key, fields, version, last_command_id, updated_at)
    SELECT i.account_id, i.record_key, i.fields::jsonb, 1, i.command_id, %(now)s
      FROM unnest(%(i_accounts)s::bigint[], %(i_keys)s::text[], %(i_fields)s::text[], %(i_commands)s::text[])
           AS i(account_id, record_key, fields, command_id)
     ORDER BY i.account_id, i.record_key
 RETURNING id
), res AS (
    INSERT INTO connector_applicationresult (command_id, execution_ref_digest, outcome, result_digest, receipt,
                                             detail, committed_at)
    SELECT a.command_id, a.ref_digest, a.outcome, a.result_digest, a.receipt, a.outcome, %(now)s
      FROM unnest(%(r_commands)s::text[], %(r_refs)s::bytea[], %(r_outcomes)s::text[], %(r_digests)s::bytea[],
                  %(r_receipts)s::bytea[]) WITH ORDINALITY AS a(command_id, ref_digest, outcome, result_digest,
                                                               receipt, ord)
     ORDER BY a.ord
 RETURNING command_id
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM ins), (SELECT count(*) FROM res)"""


# Which epoch row an exact digest names (pk, ID, digest): immutable facts, cached in-process by the exact digest
# (a digest can never name another epoch's content). Cleared whenever this process opens a database session,
# like the route cache: a restore may bring back primary keys seen before (D-220).
_EPOCHS: dict[bytes, ServingEpoch] = {}

# Account keys by pk, per process: an account's key and pk never change (accounts are not renamed, and their rows
# are referenced by PROTECT foreign keys); cleared with the epochs whenever this process opens a database session.
_ACCOUNT_KEYS: dict[int, str] = {}


def _epochs_by_digest(digests) -> dict[bytes, ServingEpoch]:
    missing = [d for d in digests if d not in _EPOCHS]
    if missing:
        for e in ServingEpoch.objects.filter(digest__in=missing).only("pk", "epoch_id", "digest", "state"):
            _EPOCHS[bytes(e.digest)] = e
    return {d: _EPOCHS[d] for d in digests if d in _EPOCHS}


def _forget_epochs(**_signal) -> None:
    _EPOCHS.clear()
    _ACCOUNT_KEYS.clear()


connection_created.connect(_forget_epochs, weak=False, dispatch_uid="connector.services.runtime._forget_epochs")


def _plan(command: RuntimeCommand, fields: dict, epochs: dict[bytes, ServingEpoch]) -> _Planned | None:
    """The command's one CRM change if it is the common case the batch path applies (a single item, a mapping that
    resolves, a record key), else None: the command takes the per-command path. A route that pushes keeps its
    frozen definition: the batch authors its outbound command under the guard (D-293). `fields`: the command's
    decoded ExecutionRef."""
    epoch = epochs.get(bytes(fields["epoch_digest"]))
    if epoch is None:
        return None  # the per-command path raises RuntimeResultMismatch
    route = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=command.account_id,
                      channel=fields["route"])
    pushes = bool(route.definition.get("push")) and not bool(fields.get("suppress_external_effects"))
    mapping = mapping_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), business_key=route.mapping_key) \
        if route.mapping_key else None
    data = json.loads(bytes(command.input))
    if not isinstance(data, dict) or "members" in data or not data.get("record_key"):
        return None
    try:
        values = ({target: resolve_pointer(data["data"], source) for source, target in mapping}
                  if mapping else dict(data["data"]))
    except BodyUnparseable:
        return None
    return _Planned(command, hashlib.sha256(bytes(command.execution_ref)).digest(), str(data["record_key"]), values,
                    epoch, route.definition if pushes else None)


def _result_of(command_id: str, ref_digest: bytes, outcome: str) -> tuple[bytes, bytes]:
    """(result digest, receipt) exactly as `runtime_command_apply` computes them for a one-item command."""
    result_digest = hashlib.sha256(encode(RESULT_RECEIPT_PROTOCOL + "/result", rec(
        command_id=command_id, outcome=outcome, items=[outcome]))).digest()
    receipt = encode(RESULT_RECEIPT_PROTOCOL, rec(command_id=command_id, execution_ref_digest=ref_digest,
                                                  outcome=outcome, result_digest=result_digest))
    return result_digest, receipt


@tracing.traced("runtime_commands_apply")
def runtime_commands_apply(*, commands: list[RuntimeCommand]) -> dict[str, ResultReceipt | None]:
    """Apply a batch of commands exactly once, in one Runtime transaction (D-254): the same outcomes, results and
    receipts as `runtime_command_apply` per command, in a constant number of statements for the batch.

    Returns, per command ID, its ResultReceipt (stored earlier: returned as is, nothing applied again; or applied
    and committed now together with its CRM change), or None: that command takes the per-command path
    (`runtime_command_apply`), which is the only semantics; this is an optimization of its common case. None is
    returned for a windowed (members) input, an unresolvable mapping or record key, an ExecutionRef naming no epoch, a stored result bound to another
    ExecutionRef digest, a second command of the batch on a record an earlier one changes, and for every command of
    the batch when the batch transaction fails for any reason (it then rolled back: nothing of the batch stands).

    A route that pushes outbound is applied here too (D-293): the guard of its accounts is taken before any CRM
    row, each applied change authors its outbound command through the same author hook and in the same
    transaction; a refused guard or item rolls the batch back, and the per-command path decides.

    Statements: the epochs named (one read), then BEGIN, the stored results (one read), for pushing routes the
    guard of their accounts (one statement), the CrmRecords FOR UPDATE (one statement, ascending (account,
    record key)), for each applied pushing change its outbound command (the author's statements), every change
    and every ApplicationResult (one statement), COMMIT. `fault_point("runtime.batch_before_commit")` fires before the COMMIT."""
    out: dict[str, ResultReceipt | None] = {c.command_id: None for c in commands}
    if not commands:
        return out
    try:
        refs = {}
        for c in commands:
            try:
                refs[c.command_id] = dict(decode(bytes(c.execution_ref))[1])
            except Exception:  # noqa: BLE001 - an unreadable ExecutionRef: the per-command path fails it
                continue
        epochs = _epochs_by_digest({bytes(f["epoch_digest"]) for f in refs.values() if "epoch_digest" in f})
        planned, keys = [], set()
        for c in commands:
            if c.command_id not in refs:
                continue
            try:
                p = _plan(c, refs[c.command_id], epochs)
            except Exception:  # noqa: BLE001 - an unusual input: the per-command path decides (and isolates it)
                p = None
            if p is None or (c.account_id, p.record_key) in keys:
                continue  # a record changed twice in one batch keeps its order: the later one runs alone after
            keys.add((c.account_id, p.record_key))
            planned.append(p)
        if not planned:
            return out
        with transaction.atomic(durable=True):
            stored = {r.command_id: r for r in ApplicationResult.objects.filter(
                command_id__in=[p.command.command_id for p in planned])}
            todo = []
            for p in planned:
                found = stored.get(p.command.command_id)
                if found is None:
                    todo.append(p)
                elif hmac.compare_digest(bytes(found.execution_ref_digest), p.ref_digest):
                    out[p.command.command_id] = _receipt(found)  # idempotent: applied before, nothing again
            if todo:
                _apply_planned(todo, out)
            fault_point("runtime.batch_before_commit")
    except Exception as exc:  # noqa: BLE001 - rolled back as a whole; every command takes the per-command path
        poison.log_fallback(log, exc, "runtime_commands_apply: batch of %d rolled back; per-command path",
                            len(commands))
        return {c.command_id: None for c in commands}
    return out


def _account_keys(account_ids) -> dict[int, str]:
    missing = [a for a in account_ids if a not in _ACCOUNT_KEYS]
    if missing:
        _ACCOUNT_KEYS.update(ConnectorAccount.objects.filter(pk__in=missing).values_list("pk", "account_key"))
    return {a: _ACCOUNT_KEYS[a] for a in account_ids}


def _guard_pushing(todo: list[_Planned]) -> dict[int, object]:
    """The serving guard of every account whose batch authors outbound, taken before any CRM row, as the
    per-command path takes it (CV2-10-005): one statement for all of them (`lock_serving_accounts`, ascending
    account id), then each command's exact epoch checked against the locked rows (`lock_serving`, no round
    trip). A refusal raises: the batch rolls back and every command takes the per-command path, which refuses it
    with its own code."""
    pushing = [p for p in todo if p.push is not None]
    if not pushing:
        return {}
    lock_serving_accounts(account_ids={p.command.account_id for p in pushing})
    return {p.command.command_id: lock_serving(account_id=p.command.account_id, epoch_id=p.epoch.epoch_id,
                                               epoch_digest=bytes(p.epoch.digest)) for p in pushing}


def _author(todo: list[_Planned], outcomes: dict[str, str], ctxs: dict[str, object]) -> None:
    """Author the outbound command of every applied change of a pushing route, in the batch transaction, through
    the same author hook as `runtime_command_apply`. A refused item (ApplicationItemRejected) or any other error
    raises: the batch rolls back and the per-command path records the refusal in the item's savepoint."""
    applied = [p for p in todo if p.push is not None and outcomes[p.command.command_id] == "applied"]
    if not applied:
        return
    keys = _account_keys({p.command.account_id for p in applied})
    calls = [dict(ctx=ctxs[p.command.command_id], account_key=keys[p.command.account_id], route_definition=p.push,
                  command_id=p.command.command_id, record_key=p.record_key, fields=p.values,
                  suppress_external_effects=False, execution_id=p.command.execution_id) for p in applied]
    hooks.author_outbound(calls)


def _apply_planned(todo: list[_Planned], out: dict[str, ResultReceipt | None]) -> None:
    """Inside the batch transaction: the guard of pushing accounts, lock the records, decide each outcome like
    `_apply_record`, author the outbound commands of applied pushing changes, write."""
    conn = transaction.get_connection()
    ctxs = _guard_pushing(todo)
    ordered = sorted(todo, key=lambda p: (p.command.account_id, p.record_key))
    with conn.cursor() as cursor:
        cursor.execute(_CRM_LOCK_SQL, {"accounts": [p.command.account_id for p in ordered],
                                       "keys": [p.record_key for p in ordered]})
        records = {(int(a), k): (int(pk), json.loads(f), int(v)) for pk, a, k, f, v in cursor.fetchall()}
    upd, ins, res, outcomes = [], [], [], {}
    now = timezone.now()
    for p in todo:
        cid = p.command.command_id
        if "email" in p.values and "@" not in str(p.values["email"]):
            outcome = "rejected"
        else:
            record = records.get((p.command.account_id, p.record_key))
            if record is None:
                ins.append((p.command.account_id, p.record_key, json.dumps(p.values), cid))
                outcome = "applied"
            else:
                merged = {**record[1], **p.values}
                if merged == record[1]:
                    outcome = "noop"
                else:
                    upd.append((record[0], p.command.account_id, json.dumps(merged), cid))
                    outcome = "applied"
        outcomes[cid] = outcome
        result_digest, receipt = _result_of(cid, p.ref_digest, outcome)
        res.append((cid, p.ref_digest, outcome, result_digest, receipt))
    _author(todo, outcomes, ctxs)
    with conn.cursor() as cursor:
        cursor.execute(_APPLY_SQL, {
            "now": now,
            "u_ids": [u[0] for u in upd], "u_accounts": [u[1] for u in upd], "u_fields": [u[2] for u in upd],
            "u_commands": [u[3] for u in upd],
            "i_accounts": [i[0] for i in ins], "i_keys": [i[1] for i in ins], "i_fields": [i[2] for i in ins],
            "i_commands": [i[3] for i in ins],
            "r_commands": [r[0] for r in res], "r_refs": [r[1] for r in res], "r_outcomes": [r[2] for r in res],
            "r_digests": [r[3] for r in res], "r_receipts": [r[4] for r in res]})
        counts = tuple(int(x) for x in cursor.fetchone())
    if counts != (len(upd), len(ins), len(res)):
        raise AssertionError(f"batch apply wrote {counts}, expected {(len(upd), len(ins), len(res))}")
    for cid, ref_digest, outcome, result_digest, receipt in res:
        out[cid] = ResultReceipt(cid, ref_digest, outcome, result_digest, receipt, now)


def runtime_results_get(*, command_ids: list[str]) -> dict[str, ResultReceipt]:
    """The stored result receipts of several commands in one read (the batched result recording reads them back
    from Runtime, never from the caller's word). Each carries its ExecutionRef digest: the caller compares it
    with the one it holds, as `runtime_result_get` does (a mismatch takes the per-command path, which fails
    closed)."""
    if not command_ids:
        return {}
    return {r.command_id: _receipt(r) for r in ApplicationResult.objects.filter(command_id__in=list(command_ids))}
