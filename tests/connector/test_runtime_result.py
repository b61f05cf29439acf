"""The Runtime-owned ApplicationResult: committed in the application transaction, the only basis of completion,
and never copied into the Execution beyond its identities, digests and receipt (CV2-08). Real PostgreSQL."""
from __future__ import annotations

from unittest import mock

import pytest

from connector.choices import ExecutionState
from connector.errors import TransitionRefused
from connector.models import ApplicationResult, CrmRecord, Execution
from connector.services import execution, runtime
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import advance_lanes, build_inbound_world, deliver, webhook_body, webhook_event

WEBHOOK = "records.webhook"


@pytest.fixture
def ready(db) -> Execution:
    world = build_inbound_world("rr-", [PACK_A])
    deliver(world, WEBHOOK, webhook_body(webhook_event("E-1", "rec-1", 1, full_name="Ada")))
    [minted] = advance_lanes()
    return minted


def _apply(row: Execution):
    return runtime.runtime_command_apply(command_id=row.command_id, execution_ref=bytes(row.execution_ref),
                                         input=bytes(row.projection.input), account_id=row.account_id,
                                         execution_id=row.pk)


def test_the_crm_change_and_its_application_result_commit_together(ready):
    """When the ApplicationResult cannot be written, the CRM mutation of the same command is rolled back with
    it: there is never a committed application change without its result. Retried, both commit once, the record
    naming the result's command. Proves: CV2-08-002"""
    row = Execution.objects.select_related("projection").get(pk=ready.pk)
    with mock.patch.object(ApplicationResult.objects, "create", side_effect=RuntimeError("result store down")):
        with pytest.raises(RuntimeError, match="result store down"):
            _apply(row)
    assert (CrmRecord.objects.count(), ApplicationResult.objects.count()) == (0, 0)
    receipt = _apply(row)
    record, result = CrmRecord.objects.get(), ApplicationResult.objects.get()
    assert record.last_command_id == result.command_id == receipt.command_id == row.command_id
    assert (record.version, result.outcome) == (1, "applied")


def test_completion_rests_only_on_the_application_result(ready):
    """Runtime having been asked (a claim, an accepted submission) completes nothing: without Runtime's
    ApplicationResult for the exact command and ExecutionRef the Execution cannot be closed and stays `ready`;
    once the result exists it completes from it. Proves: CV2-08-009"""
    token = execution.execution_claim(holder="w-1", lease_seconds=60)
    assert token is not None and token.execution_pk == ready.pk
    with pytest.raises(TransitionRefused, match="no Runtime result receipt"):
        execution.execution_record_result(execution_pk=ready.pk, command_id=ready.command_id,
                                          execution_ref_digest=bytes(ready.execution_ref_digest),
                                          lease_fence=token.lease_fence)
    assert Execution.objects.get(pk=ready.pk).state == ExecutionState.READY
    done = execution.execution_run(token=token)
    assert done.state == ExecutionState.COMPLETED


def test_the_execution_keeps_only_identities_digests_and_the_runtime_receipt(ready):
    """The completed Execution holds the command ID, ExecutionRef digest, the result's outcome and digest and
    Runtime's commit receipt, byte-equal to Runtime's; Runtime's result detail is never copied into connector
    execution state. Proves: CV2-08-007"""
    token = execution.execution_claim(holder="w-1", lease_seconds=60)
    done = execution.execution_run(token=token)
    result = ApplicationResult.objects.get(command_id=done.command_id)
    assert (bytes(done.execution_ref_digest), bytes(done.result_digest), bytes(done.runtime_receipt)) == (
        bytes(result.execution_ref_digest), bytes(result.result_digest), bytes(result.receipt))
    assert done.result_outcome == result.outcome
    result_columns = {f.name for f in Execution._meta.concrete_fields if f.name.startswith(("result", "runtime"))}
    assert result_columns == {"result_outcome", "result_digest", "runtime_receipt"}
    assert not [f.name for f in Execution._meta.concrete_fields if "detail" in f.name or "payload" in f.name]
