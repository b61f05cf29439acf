"""The closed map of halted and quarantined reasons (the seed's "Operational liveness": every halted or
quarantined reason has a closed reason code, an evidence query, an alert deadline, a responsible owner and the
allowed remediation). A code the map does not know is shown as UNMAPPED with an immediate deadline: it fails
closed, and a test proves every code the product can write is mapped."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from connector.services.poison import STEP_FAILURE_REASONS
from effects.delivery.contract import contract


@dataclass(frozen=True)
class Reason:
    code: str
    title: str
    owner: str
    deadline: timedelta  # alert deadline after the item entered this reason (escalation only; never a release)
    remediation: tuple[str, ...]


def _r(code, title, owner, minutes, *remediation) -> Reason:
    return Reason(code, title, owner, timedelta(minutes=minutes), tuple(remediation))


REASONS: dict[str, Reason] = {r.code: r for r in (
    _r("EFFECT_UNCERTAIN", "Remote effect uncertain: the request may have reached the provider", "integration on-call",
       30, "Query the provider by idempotency key, then reconcile: remote_confirmed, no_effect (with proof), "
           "idempotent_repeat (only with the frozen provider idempotency key) or quarantine"),
    _r("OPERATOR_QUARANTINE", "Effect quarantined by an operator", "integration on-call", 240,
       "A new business intent needs a new EffectRoot; the quarantined effect stays as evidence"),
    _r("CREDENTIAL_MATERIAL_MISSING", "Frozen credential version is missing", "credential authority", 60,
       "Restore the exact secret version, or author a new intent under a new credential generation"),
    _r("REMOTE_LINK_CONFLICT", "Remote identity already linked to another owner slot", "integration on-call", 60,
       "Inspect both owners; retire the wrong RemoteLink through its owner"),
    _r("DEPENDENCY_EXPIRED", "Execution quarantined: its dependency expired", "runtime owner", 120,
       "Replay the source event or remediate the dependency owner"),
    _r("DEPENDENCY_REJECTED", "Execution quarantined: its dependency was rejected", "runtime owner", 120,
       "Replay after correcting the dependency"),
    _r("RESULT_FAILED", "Execution quarantined: Runtime reported failure", "runtime owner", 60,
       "Inspect the ApplicationResult; replay with a ReplayRequest once corrected"),
    _r("RESULT_REJECTED", "Execution quarantined: Runtime rejected the command", "runtime owner", 120,
       "Inspect the ApplicationResult; correct the upstream generation"),
    _r("GAP_DEADLINE", "Ordering lane halted at a source gap past its deadline", "source owner", 60,
       "Obtain the missing event from the provider, or record a skip_with_evidence decision where the route "
       "allows it"),
    _r("ORDERING_HANDOFF", "Predecessor ordering lane frozen by an OrderingHandoff (successor epoch)", "service owner",
       240, "Nothing to remediate on the lane: complete the successor activation (`manage.py succession status`); "
            "the predecessor is never resumed after the first handoff"),
    _r("EVENT_KEY_CONFLICT", "Same source event key, different bytes", "source owner", 240,
       "Compare both receipts; correct the provider or author a new pack generation"),
    _r("V1_IO_MAY_HAVE_STARTED", "V1 effect interrupted by the V1 shutdown: the provider call may have started",
       "records-integration-team", 15, "Query the provider by the V1 request key, then reconcile it in v1_stopped "
       "(remote_finalized or no_effect, with the evidence) on the cutover console; V1 never dispatches again"),
    _r("GATE_HALTED", "Account gate halted (halting_v2 / v2_halted)", "service owner", 60,
       "Finish the drain (open permits must settle) or resume through the serving gate actions"),
    _r("CREDENTIAL_REVOKED", "Credential generation dispatch gate revoked", "credential authority", 120,
       "Author a new credential generation; revoked generations never re-enable"),
    _r("DELIVERY_GATE_BLOCKED", "Delivery mutation gate blocked", "platform on-call", 15,
       "Run a reconciliation campaign, then a second person approves a new journal epoch"),
    *(_r(code, f"Delivery: {code.removeprefix('REST_DELIVERY_').replace('_', ' ').lower()}",
         "delivery on-call" if spec.alert_severity == "critical" else "route owner",
         30 if spec.alert_severity == "critical" else 240, spec.operator_action.replace("_", " "))
      for code, spec in contract().errors.items()),
)}

# A deterministic failure of a sweeper or worker step on one item (decision D-168): the connector owns the texts,
# so the admin pages of the items show the same owner and remediation as the board.
REASONS.update({str(code): _r(str(code), *spec) for code, spec in STEP_FAILURE_REASONS.items()})

UNMAPPED = Reason("UNMAPPED", "Reason code outside the closed map", "platform on-call", timedelta(0),
                  ("Report it: every reason must be mapped before it can be remediated",))


def reason(code: str) -> Reason:
    return REASONS.get(code, UNMAPPED)
