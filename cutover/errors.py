"""The cutover app's closed error catalog for V2 -> V2 succession (extends connector.errors.ConnectorError).
Every refusal writes nothing: services raise before or instead of writing and the transaction rolls back."""
from __future__ import annotations

from connector.errors import ConnectorError


class SuccessorClassUnsupported(ConnectorError):
    """Only the `requires_drain` successor transition is authorized; every other class is refused regardless of
    the compatibility evidence supplied (CV2-11-002/003/058)."""

    code = "SUCCESSOR_CLASS_UNSUPPORTED"
    http_status = 422
    operator_action = "Plan a requires_drain succession; another class needs a separate normative change."


class BarrierSetRefused(ConnectorError):
    """The publication barrier set is missing, held by another attempt, in the wrong state, or its release is not
    allowed by the succession rules."""

    code = "BARRIER_SET_REFUSED"
    http_status = 409
    operator_action = "Read `manage.py succession status`; act with the current holder fence."


class SuccessorDrifted(ConnectorError):
    """The successor epoch is not the exact verified epoch the barrier set binds, or its owners changed."""

    code = "SUCCESSOR_DRIFTED"
    http_status = 409
    operator_action = "Release the barrier set and prepare and verify a new successor epoch."


class HandoffRefused(ConnectorError):
    """The OrderingHandoff cannot be frozen: a gate is not v2_halted, the lane still has nonterminal work, or its
    comparator or partition contract changed."""

    code = "HANDOFF_REFUSED"
    http_status = 409
    retryable = True
    operator_action = "Drain the predecessor lane to terminal decisions (and halt every gate), then retry."


class SuccessorActivationRefused(ConnectorError):
    """The successor activation transaction found a gate, epoch, handoff or successor lane not as required;
    nothing moved."""

    code = "SUCCESSOR_ACTIVATION_REFUSED"
    http_status = 409
    operator_action = "Complete the missing phase (`manage.py succession status` names it) and retry."


class SuccessionDrainRefused(ConnectorError):
    """The succession drain cannot open or complete: no held barrier set, a gate not `v2_serving` on the active
    predecessor, the drain in another state, or continuation work of the predecessor not yet terminal (the
    inventory is listed). Nothing moved; the drain never completes because time passed (D-316)."""

    code = "SUCCESSION_DRAIN_REFUSED"
    http_status = 409
    retryable = True
    operator_action = ("Let the listed continuation work finish under v2_serving and rerun `manage.py succession "
                       "drain`, or release the barrier set to abort.")


class SuccessionNotDrained(ConnectorError):
    """The succession coordinator's halt needs the attempt's drain `drained` first (CV2-11-005): gates enter
    `halting_v2` only after continuation work drained under `v2_serving`."""

    code = "SUCCESSION_NOT_DRAINED"
    http_status = 409
    operator_action = "Run `manage.py succession drain` until it reports drained, then halt."


# -- V1 -> V2 service cutover up to v1_drained ------------------------------------------------------------------

class CutoverPreflightRefused(ConnectorError):
    """Preflight refuses the cutover: an unsupported or unproved route, no lossless halt contract or remediation
    owner, an unsupported egress manifest, incomplete budgets, an unreadable owner, a failed representative restore
    rehearsal, a projection over budget, or another open attempt (CV2-12-012..017). `context["reasons"]` names each
    by its stable code (docs/cutover.md "Preflight measurements")."""

    code = "CUTOVER_PREFLIGHT_REFUSED"
    http_status = 422
    operator_action = "Fix the named input and open a NEW attempt; a certificate is never edited."


class OrderingPlanRefused(CutoverPreflightRefused):
    """Preflight refuses the cutover before maintenance: a route has neither a checked order-independence
    conformance proof nor complete typed source-order facts, an enabled route is unsupported or has no
    disposition, or a high-water is an enqueue ordinal or arrival order (CV2-06-008/019/021/022; the detail names
    each route with its cutover.services.ordering_plan reason code)."""

    code = "ORDERING_PLAN_REFUSED"
    http_status = 422
    operator_action = ("Attach the route's conformance proof or typed source-order facts, or disable the route in a "
                       "new configuration generation, then open a NEW attempt.")


class V2ArtifactMismatch(ConnectorError):
    """The offline verification before maintenance failed (CV2-12-019): the V2 schema digest or the V2 binary digest
    differs from the one frozen in the CutoverReadinessCertificate, the candidate epoch is no longer `verified` with
    the certificate's digest, or V2 is not provably disabled (an active epoch, a V2 receipt, a gate outside
    v1_serving/halting_v1). Nothing changed: no barrier closed, no gate moved. `context["reasons"]` lists each."""

    code = "V2_ARTIFACT_MISMATCH"
    http_status = 409
    operator_action = ("Deploy exactly the certified V2 release and schema (or open a new attempt and certify the "
                       "new ones), keep V2 disabled, then close the barriers again.")


class V1RemovalRefused(ConnectorError):
    """The V1 tables cannot be removed yet (CV2-12-078): V1 is not retired (no `v2_committed` attempt), or a V2 fact
    still depends on a V1 row: a V1 transport identity without its exact tombstone, a drained high-water without
    its OrderingBaseline, a replay predecessor reference naming a V1 row that has no tombstone, or an audit record
    of a V1 row still inside the retention period. Nothing was dropped; `context["reasons"]` lists the stable
    dependency codes (docs/cutover.md "Removing the V1 tables")."""

    code = "V1_REMOVAL_REFUSED"
    http_status = 409
    operator_action = ("Read the listed dependencies (`manage.py v1_tables remove --check`); export the missing "
                       "evidence or wait for the audit retention to pass, then retry.")


class CutoverPhaseRefused(ConnectorError):
    """The cutover phase cannot run now: the attempt is closed or unknown, a gate is not in the phase's mode, the
    account/gate set drifted, a receipt does not name the attempt, or the certificate bytes do not verify."""

    code = "CUTOVER_PHASE_REFUSED"
    http_status = 409
    operator_action = "Read `manage.py cutover status`; run the phase it names next."


class OrderingPlanDrifted(CutoverPhaseRefused):
    """After certification, the recomputed ordering plan (owner route contracts and source-order facts, the frozen
    configuration's enabled routes, the candidate epoch's routes and proofs) or a captured high-water's comparator
    differs from the readiness certificate's: the capture never executes a plan that was not proved."""

    code = "ORDERING_PLAN_DRIFTED"
    http_status = 409
    operator_action = "Abort the attempt; restore the certified ordering facts or certify a NEW attempt."


class DrainBlocked(ConnectorError):
    """V1 still has work that blocks the drain or the shutdown certificate (nonterminal items, live leases,
    effects whose provider I/O may have started, missing tombstones or baselines). Never resolved by a timeout."""

    code = "DRAIN_BLOCKED"
    http_status = 409
    retryable = True
    operator_action = "Let V1 finish, or reconcile io_may_have_started effects with evidence in v1_stopped."


# -- V1 restore point, rehearsal, begin validation, cold abort and full restore (engineer C) -------------------

class RestorePointRefused(ConnectorError):
    """A restore point cannot be captured: a frozen gate is not `v1_drained`, the attempt has no
    V1ShutdownCertificate, a V2 execution row exists for the attempt's accounts, the candidate epoch is active,
    or the snapshot tools are missing (CV2-12-050/051, decision 2)."""

    code = "RESTORE_POINT_REFUSED"
    http_status = 409
    operator_action = "Finish the drain (every gate v1_drained, certificate written) with no V2 mutation, then retry."


class RestorePointInvalid(ConnectorError):
    """The restore point's dump or digests do not verify: a truncated or missing dump, an empty database, a
    schema/content digest mismatch, or live drift since capture (CV2-12-052/053)."""

    code = "RESTORE_POINT_INVALID"
    http_status = 409
    operator_action = ("Do not begin validation; cold-abort to V1 or capture a new restore point after "
                       "investigating the drift.")


class RestoreRefused(ConnectorError):
    """A restore or V1 downgrade is refused: a ServingEpoch first became active, the CutoverDecision chose
    activation, or a V2 admission / Runtime submission / provider I/O / source ack exists for the attempt's scope
    (CV2-12-076/083/098)."""

    code = "RESTORE_REFUSED"
    http_status = 409
    operator_action = "Stay on V2; recovery after first activation is forward-only (V2 -> V2 succession)."


class ColdAbortRefused(ConnectorError):
    """Cold abort is only for `v1_drained` before any V2 mutation (CV2-12-072/082); later, use the full restore."""

    code = "COLD_ABORT_REFUSED"
    http_status = 409
    operator_action = "Read `manage.py restore_point status`; after validation began use `restore_point restore`."


# -- first activation ----------------------------------------------------------------------------------------------

class ActivationLost(ConnectorError):
    """A RestoreAttempt won the CutoverDecision first: the activation recorded nothing and released its barrier
    set (CV2-12-066/097). A stale activation coordinator cannot reacquire."""

    code = "ACTIVATION_LOST"
    http_status = 409
    operator_action = "Follow the restore (`manage.py restore_point status`); plan a new attempt later."


class PublicationBarrierHeld(ConnectorError):
    """A publication barrier set is held for an activation: owner publications (and revocations once activation
    won) are refused until it is released."""

    code = "PUBLICATION_BARRIER_HELD"
    http_status = 409
    retryable = True
    operator_action = "Retry after the activation finished or was aborted (cutover console)."


class ActivationInventoryUncovered(ConnectorError):
    """The closed activation inventory (CV2-12-010, D-320) finds a supported path without its selected authority
    (an account without a serving gate, a gate not `v2_validating`, an enabled route without its frozen binding or
    whose path kind has no registered authority, a credential generation without a dispatch gate, a certified
    partition without its OrderingLane), or it differs from the inventory frozen when the set was held. The
    activation is not held or committed; nothing was written."""

    code = "ACTIVATION_INVENTORY_UNCOVERED"
    http_status = 409
    operator_action = ("Read the uncovered paths in the detail; give each its authority (or release the barrier set "
                       "and plan a new attempt), then hold again.")
