"""Named crash points for the crash-injection tests. When CONNECTOR_FAULT_POINT names a point, the process
kills itself with SIGKILL at that point (no cleanup, no rollback handlers: a real crash). When CONNECTOR_FAULT_RAISE
names a point, the step raises FaultInjected there instead (a failing step in a process that goes on, e.g. a
finalization failing inside its savepoint, D-337). Unset in production, where `fault_point` is two dictionary
lookups and nothing else."""
from __future__ import annotations

import os
import signal

POINTS = (
    "admission.after_receipt_commit",  # Receipt durable, HTTP answer not sent, children not materialized
    "materialize.after_components",  # some children written in an uncommitted transaction
    "advance.before_commit",  # lanes advanced (D-295, D-521): Executions minted, not committed
    "claim.after_commit",  # Execution claimed, Runtime not called
    "runtime.after_commit",  # Runtime committed the result, connector has not recorded it
    "result.before_commit",  # connector recording the result, not yet committed
    "runtime.batch_before_commit",  # Runtime's batch transaction wrote CRM changes and results, not committed
    "runtime.batch_after_commit",  # Runtime's batch committed its results, none recorded by the connector
    "result.batch_before_commit",  # the batch's completions written, not committed
    "egress.after_sending",  # granted -> sending committed, no byte sent yet
    "egress.after_request",  # the provider answered (or not), settlement not committed
    "dispatch.after_confirmed",  # remote success recorded, local finalization not committed
    "dispatch.finalize_in_settlement",  # settlement written, finalization written in its savepoint (D-336)
    "dispatch.batch_claim_before_commit",  # a batch's claims + permits written in one transaction (D-347), uncommitted
    "dispatch.batch_sending_before_commit",  # a batch's granted -> sending markers written (D-349), not committed
    "dispatch.batch_settle_before_commit",  # a batch's confirmed settlements + finalizations (D-348), uncommitted
    "dispatch.withdraw_before_commit",  # a deferred destination's granted permits withdrawn (D-373), not committed
    "delivery.after_submit",  # delivery attempt reserved (SUBMITTING, marker, attempt) committed, no I/O marked
    "delivery.after_io_marked",  # io_may_have_started committed, no byte sent yet
    "delivery.after_request",  # the receiver answered (or not), the outcome not recorded
    "succession.after_acquire",  # successor barrier set `acquiring` committed, owners not reread
    "succession.after_hold",  # successor barrier set `held` committed, no drain open
    "succession.after_drain",  # the drain `drained` committed, every gate still v2_serving on the predecessor
    "succession.after_halt",  # every gate v2_halted on the predecessor committed, no handoff yet
    "succession.after_handoff_chunk",  # one chunk's OrderingHandoffs committed (the cutoff), others not yet
    "succession.drain_open_before_commit",  # the succession drain row written (roots closed), not committed
    "succession.drain_complete_before_commit",  # the drain `draining -> drained` written, not committed
    "succession.before_commit",  # successor activation wrote every transition, not yet committed
    "succession.after_commit",  # successor activation committed, barrier set not yet released
    "restore.after_restoring_v1",  # CutoverDecision restoring_v1 and the RestoreAttempt durable, nothing restored
    "restore.after_pg_restore",  # default replaced by the dump, RestoreAttempt still `started`
    "restore.after_recovery_receipt",  # recovery receipt durable, CutoverDecision still restoring_v1, V1 offline
    "v1.after_dispatching",  # V1 committed its pre-I/O marker (`dispatching`), no byte sent yet
    "v1.after_request",
    "cutover.certify_before_commit",
    "activation.after_acquire",  # first-activation set `acquiring` and its owner receipts committed
    "activation.after_hold",  # first-activation set `held` committed, CutoverDecision still rollback_open
    "activation.after_decision",  # CutoverDecision activating_v2 committed, activation transaction open
    "activation.before_commit",  # barrier set, epoch and every gate written, not committed
    "activation.after_commit",  # activation committed, not read back, decision still activating_v2
    "activation.after_v2_committed",  # decision v2_committed, barrier set not released, attempt open  # shutdown certificate and every v1_drained move written, not committed  # the V1 provider call returned (or not), the V1 effect not finalized
)


class FaultInjected(RuntimeError):
    """Raised at the point CONNECTOR_FAULT_RAISE names (a step that fails, not a process that dies)."""


def fault_point(name: str) -> None:
    if os.environ.get("CONNECTOR_FAULT_POINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("CONNECTOR_FAULT_RAISE") == name:
        raise FaultInjected(f"fault injected at {name}")
