"""The closed reason-code map of a V1 -> V2 cutover: every reason the service can stay halted for during the
maintenance, with its evidence query, alert deadline, responsible owner and allowed remediation (CV2-13-001). A
readiness certificate freezes this map; the cutover console and the halt board show it."""
from __future__ import annotations

CUTOVER_REASONS: dict[str, dict[str, str | int]] = {
    "V1_DRAIN_BLOCKED": {
        "evidence": "manage.py cutover status --attempt <key> (V1 inventory: blocking rows)",
        "alert_minutes": 30, "owner": "cutover coordinator",
        "remediation": "let V1 finish accepted work; on a budget breach take the fenced abort to v1_serving"},
    "V1_IO_MAY_HAVE_STARTED": {
        "evidence": "V1 effects in `dispatching` or `ambiguous` for the attempt's accounts",
        "alert_minutes": 15, "owner": "records-integration-team",
        "remediation": "append remote_finalized or no_effect evidence (fenced reconciliation in v1_stopped)"},
    "CUTOVER_BUDGET_BREACHED": {
        "evidence": "the remeasurement against the readiness certificate's projections",
        "alert_minutes": 5, "owner": "cutover coordinator",
        "remediation": "fenced abort halting_v1 -> v1_serving before termination"},
    "RESTORE_POINT_MISSING": {
        "evidence": "V1RestorePoint and its rehearsal for the attempt (journal database)",
        "alert_minutes": 60, "owner": "L2 backup owner",
        "remediation": "capture and rehearse the restore point, or cold-abort to a new V1 generation"},
    "V2_VALIDATION_FAILED": {
        "evidence": "the candidate epoch's rejection code and the gates in v2_validating",
        "alert_minutes": 15, "owner": "cutover coordinator",
        "remediation": "full restore of the V1RestorePoint (RestoreAttempt)"},
}
