"""Runtime: the application side. It commits the CRM mutation and the immutable ApplicationResult in one
transaction; the same command + ExecutionRef digest returns the stored result, and a mismatched digest fails
closed (CV2-08). It resolves everything through the frozen epoch named in the ExecutionRef."""
from __future__ import annotations

import hashlib
import hmac
import json
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction

from connector.canonical.decoding import decode
from connector.canonical.encoding import encode
from connector import hooks, tracing
from connector.errors import ApplicationItemRejected, ConnectorError
from connector.interpreters.inbound import BodyUnparseable, resolve_pointer
from connector.models import ApplicationResult, ConnectorAccount, CrmRecord, ServingEpoch
from connector.receipts import rec
from connector.selectors.routes import mapping_for, route_for
from connector.services.guard import lock_serving

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
                            hooks.author_outbound(ctx=ctx, account_key=ctx_account_key(account_id),
                                                  route_definition=route.definition, command_id=command_id,
                                                  record_key=item["record_key"], fields=values,
                                                  suppress_external_effects=suppress, execution_id=execution_id)
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
