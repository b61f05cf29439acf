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

    @property
    def remedy(self) -> "Remedy":
        return remedy(self.code)


def _r(code, title, owner, minutes, *remediation) -> Reason:
    return Reason(code, title, owner, timedelta(minutes=minutes), tuple(remediation))


REASONS: dict[str, Reason] = {r.code: r for r in (
    _r("EFFECT_UNCERTAIN", "Remote effect uncertain: the request may have reached the provider", "integration on-call",
       30, "Query the provider by idempotency key, then reconcile: remote_confirmed, no_effect (with proof), "
           "idempotent_repeat (only with the frozen provider idempotency key) or quarantine"),
    _r("UNCERTAIN_REPEAT_SCHEDULED", "Remote effect uncertain: the product repeats it under its frozen idempotency "
       "contract", "integration on-call", 60,
       "Nothing to do: the sweeper repeats the byte-identical request under the same key when it is due (the item "
       "names the time); it leaves the board when the repeat is prepared, or waits for a person with "
       "UNCERTAIN_REPEATS_SPENT or UNCERTAIN_KEY_RETENTION_PASSED"),
    _r("UNCERTAIN_REPEATS_SPENT", "Remote effect uncertain after every automatic repeat its contract allows",
       "integration on-call", 30,
       "Query the provider by idempotency key (the receiver answered ambiguously each time), then reconcile: "
       "remote_confirmed, no_effect (with proof), idempotent_repeat or quarantine"),
    _r("UNCERTAIN_KEY_RETENTION_PASSED", "Remote effect uncertain; a repeat would fall outside the provider's key "
       "retention", "integration on-call", 30,
       "Query the provider by idempotency key: past the retention the provider may have forgotten it, so a repeat "
       "is no longer provably one effect; reconcile remote_confirmed, no_effect (with proof) or quarantine"),
    _r("OPERATOR_QUARANTINE", "Effect quarantined by an operator", "integration on-call", 240,
       "A new business intent needs a new EffectRoot; the quarantined effect stays as evidence"),
    _r("CREDENTIAL_MATERIAL_MISSING", "Frozen credential version is missing", "credential authority", 60,
       "Restore the exact secret version, or author a new intent under a new credential generation"),
    _r("REMOTE_LINK_CONFLICT", "The provider proved another remote identity than the owner slot's RemoteLink",
       "integration on-call", 60,
       "Look the record up at the provider, then on the effect's page either keep the existing link (evidence that "
       "the linked record is the one changed) or relink the slot to the proven identity (two approvers); the "
       "effect then finalizes. Many conflicts: select them on the board and request one approval for the set"),
    _r("RECEIVER_UNREACHABLE", "Effect ended no_effect: the receiver was unreachable for its whole retry schedule "
       "(nothing was sent)", "integration on-call", 60,
       "Once the receiver is reachable again, authorize a new remote call on the effect page (a successor generation "
       "repeating the request); or leave it terminal: the change was applied locally and is not pushed"),
    _r("NO_EFFECT_ATTEMPTS_SPENT", "Effect ended no_effect: every attempt the policy allows proved no effect (the "
       "receiver refused the request)", "integration on-call", 240,
       "Read the refusals on the effect page; after correcting the receiver or the data, authorize a new remote call "
       "on the effect page; or leave it terminal"),
    _r("LINKED_RECORD_NOT_FOUND", "Effect ended no_effect: the provider answered 404 to an update of the linked "
       "remote record (the record the RemoteLink names is not there; the push did not happen)", "integration on-call",
       60, "Look the linked identity up at the provider. Once the record exists there again (restored), authorize a "
           "new remote call on the effect page; if it is gone for good, the change stays local: leave the effect "
           "terminal with the provider's evidence in the ticket"),
    _r("OUTBOUND_PATH_UNSAFE", "Effect ended no_effect: its frozen path is outside its callout's template",
       "integration owner", 240,
       "Correct the callout template in a new pack generation; a new business intent authors a new command"),
    _r("DEPENDENCY_EXPIRED", "Execution quarantined: its dependency expired", "runtime owner", 120,
       "Replay the execution on its page once the dependency exists (a new generation, external effects "
       "suppressed)"),
    _r("DEPENDENCY_REJECTED", "Execution quarantined: its dependency was rejected", "runtime owner", 120,
       "Replay the execution on its page after correcting the dependency"),
    _r("RESULT_FAILED", "Execution quarantined: Runtime reported failure", "runtime owner", 60,
       "Inspect the ApplicationResult; once Runtime is corrected, replay the execution on its page (it runs under "
       "a new generation with external effects suppressed and resumes the partition), or resume the lane past it "
       "with evidence"),
    _r("RESULT_REJECTED", "Execution quarantined: Runtime rejected the command", "runtime owner", 120,
       "Inspect the ApplicationResult; replay it on its page once corrected, or resume the lane past it with the "
       "source's evidence that a corrected event supersedes it"),
    _r("GAP_DEADLINE", "Ordering lane halted at a source gap past its deadline", "source owner", 60,
       "Obtain the missing event from the provider; once it arrived, resume the partition on the lane's page (the "
       "late events apply in order), or resume it with the provider's evidence that the position will never "
       "exist (skip_with_evidence)"),
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


# -- remediation: the product's way out of each reason (issue 16; CV2-13-001..007) ---------------------------------
# Every reason either has a remedy the product implements (a screen or command an authorized person uses, then
# the item moves on) or is terminal, with the reason why nothing in the product moves it: it stays as evidence
# and the way forward is a new fact made by its owner (CV2-13-003). `queue`: the item waits for a human and is
# listed in the approval queue. tests/governance/test_remediation.py runs every remedy.

@dataclass(frozen=True)
class Remedy:
    kind: str  # one of REMEDY_KINDS
    action: str  # what the person does, and where
    queue: bool = True
    terminal: str = ""  # why it is terminal (kind "terminal" only)


REMEDY_KINDS = ("reconcile_effect", "automatic", "resolve_link", "remote_call", "replay", "resume_lane",
                "reconcile_delivery", "v1_reconcile",
                "gate_action", "credential_reenable", "journal_epoch", "poison_release", "epoch_reject", "terminal",
                "unmapped")


def _terminal(why: str) -> Remedy:
    return Remedy("terminal", "None: it stays as evidence", queue=False, terminal=why)


REMEDIES: dict[str, Remedy] = {
    "EFFECT_UNCERTAIN": Remedy("reconcile_effect", "Reconcile it with the provider's evidence on the effect page"),
    "UNCERTAIN_REPEAT_SCHEDULED": Remedy("automatic", "None needed: the sweeper repeats it under the same key when "
                                                      "due (D-430)", queue=False),
    "UNCERTAIN_REPEATS_SPENT": Remedy("reconcile_effect", "Reconcile it with the provider's evidence on the effect "
                                                          "page"),
    "UNCERTAIN_KEY_RETENTION_PASSED": Remedy("reconcile_effect", "Reconcile it with the provider's evidence on the "
                                                                 "effect page"),
    "REMOTE_LINK_CONFLICT": Remedy("resolve_link", "Keep the link, or relink with two approvers, on the effect "
                                                   "page"),
    # A terminal no_effect the frozen policy decided (issue 37, D-423): an operator-authorized new remote call (a
    # successor generation, D-305) is the way forward; it leaves the queue once one was authorized.
    "RECEIVER_UNREACHABLE": Remedy("remote_call", "Authorize a new remote call on the effect page once the receiver "
                                                  "is reachable (or leave it terminal: nothing was sent)"),
    "NO_EFFECT_ATTEMPTS_SPENT": Remedy("remote_call", "Authorize a new remote call on the effect page after the "
                                                      "refusal's cause is corrected (or leave it terminal)"),
    "LINKED_RECORD_NOT_FOUND": Remedy("remote_call", "Look the linked record up at the provider; once it exists "
                                                     "there again, authorize a new remote call on the effect page (or "
                                                     "leave it terminal: the change was not pushed)"),
    "OUTBOUND_PATH_UNSAFE": _terminal("the frozen path can never be sent (no attempt of these bytes can do better); "
                                      "a corrected callout template in a new pack generation and a new business "
                                      "intent author a new command"),
    "RESULT_FAILED": Remedy("replay", "Replay it on the execution page, or resume its lane past it with evidence"),
    "RESULT_REJECTED": Remedy("replay", "Replay it on the execution page, or resume its lane past it with evidence"),
    "DEPENDENCY_EXPIRED": Remedy("replay", "Replay it on the execution page"),
    "DEPENDENCY_REJECTED": Remedy("replay", "Replay it on the execution page"),
    "GAP_DEADLINE": Remedy("resume_lane", "Resume the partition on the lane page once the missing event arrived "
                                          "(or with the provider's evidence)"),
    "V1_IO_MAY_HAVE_STARTED": Remedy("v1_reconcile", "Reconcile it on the cutover attempt page"),
    "DELIVERY_GATE_BLOCKED": Remedy("journal_epoch", "Run the reconciliation campaign, then an approver approves a "
                                                     "new journal epoch (manage.py delivery)"),
    "GATE_HALTED": Remedy("gate_action", "Finish the drain or resume the gate (cutover console, admin gate "
                                         "actions)", queue=False),
    "CREDENTIAL_REVOKED": Remedy("credential_reenable", "Re-enable the generation with evidence, or author a new "
                                                        "one (admin credential gate actions)", queue=False),
    # Poison items (decision D-168): after the fix is deployed an operator releases the held item, which the next
    # sweep takes again from where it stood; a quarantined execution is replayed like any other.
    "MATERIALIZATION_FAILED": Remedy("poison_release", "After the fix, `manage.py poison_release --receipt <id>`: "
                                                       "the next sweep derives the missing children again"),
    "LANE_STEP_FAILED": Remedy("poison_release", "After the fix, `manage.py poison_release --lane <id>`: the lane "
                                                 "reopens with its high-water and pending positions"),
    "EFFECT_STEP_FAILED": Remedy("poison_release", "After the fix, `manage.py poison_release --effect <id>` lifts "
                                                   "the hold (a quarantined, never-sent effect needs a new intent)"),
    "DELIVERY_STEP_FAILED": Remedy("poison_release", "After the fix, `manage.py poison_release --delivery <id>` "
                                                     "puts the operation back in the sweep"),
    "EXECUTION_STEP_FAILED": Remedy("replay", "After the fix, replay it on the execution page (a new generation, "
                                              "external effects suppressed); its lane resumes with it"),
    "EPOCH_VERIFY_FAILED": Remedy("epoch_reject", "Reject the candidate (`epoch_reject`, admin epoch actions) and "
                                                  "prepare a new one after the fix"),
    "WINDOW_SEAL_FAILED": _terminal("the quarantined window stays as evidence of the membership it held; new input "
                                    "of its grouping key opens a successor window, and its member events are "
                                    "replayed with ReplayRequests after the fix (the replay's own remedy)"),
    "OPERATOR_QUARANTINE": _terminal("an operator quarantined the uncertain effect: quarantined is terminal (no "
                                     "listed edge leaves it); a new business intent needs a new EffectRoot "
                                     "(decision 12)"),
    "CREDENTIAL_MATERIAL_MISSING": _terminal("the frozen secret version was absent at claim, so the effect was "
                                             "quarantined instead of falling forward (CV2-10-013); quarantined is "
                                             "terminal, and a new intent is authored under a restored or new "
                                             "credential generation"),
    "ORDERING_HANDOFF": _terminal("the predecessor lane was frozen by an OrderingHandoff: it is never resumed "
                                  "after the first handoff (CV2-11-020); its successor lane continues from the "
                                  "handed-off high-water"),
    "EVENT_KEY_CONFLICT": _terminal("the component reused a live source event key with other bytes (decision 14): "
                                    "the receipt stays accepted and nothing is lost; a corrected event is new input "
                                    "with its own key, or a new pack generation"),
}
UNREMEDIED = Remedy("unmapped", "No remedy is mapped: report it (every reason needs one before it ships)")
DELIVERY_REMEDY = Remedy("reconcile_delivery", "Open and resolve a reconciliation on the delivery operation page")


def remedy(code: str) -> Remedy:
    if code in REMEDIES:
        return REMEDIES[code]
    if code in REASONS and code.startswith("REST_DELIVERY_"):
        return REMEDIES["DELIVERY_GATE_BLOCKED"] if code == "REST_DELIVERY_JOURNAL_EPOCH_BLOCKED" else DELIVERY_REMEDY
    return UNREMEDIED
