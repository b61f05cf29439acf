"""The service cutover's preflight (seed "Offline V1 shutdown", step 1; CV2-12-012..031): the attempt
(`cutover_open`), its immutable CutoverReadinessCertificate (`cutover_certify`, with the projections of every
budgeted phase), and the helpers every later phase shares (evidence digests, the attempt and its account set, the
frozen gate set, owner receipt verification). The later phases are cutover.services.v1_shutdown.
"""
from __future__ import annotations

import hashlib
import hmac
from decimal import Decimal

from django.db import transaction

from connector.actors import Actor
from connector.canonical.encoding import Record, encode
from connector.choices import EpochState
from connector.errors import PermissionRefused
from connector.selectors import locks as connector_locks
from connector.selectors.rows import AccountServingGate, ConnectorAccount, ServiceConfigurationGeneration, ServingEpoch
from connector.services import serving
from connector.services.audit import audit_record
from connector.services.gates import fsm_edge, gates_advance
from cutover.errors import (CutoverPhaseRefused, CutoverPreflightRefused, OrderingPlanRefused, RestorePointInvalid,
                            RestorePointRefused)
from cutover.models import AttemptOutcome, CutoverReadinessCertificate, ServiceCutoverAttempt
from cutover.ports import BarrierKind, Receipt as OwnerReceipt, v1_owner
from cutover.reasons import CUTOVER_REASONS
from cutover.services import ordering_plan, v2_artifacts
from cutover.services.preflight_measures import (  # noqa: F401  (project and the throughput figures, re-exported)
    OWNER_UNREADABLE,
    REHEARSAL_FAILED,
    SAFETY_FACTOR,
    SECONDS_PER_BACKLOG_ITEM,
    measure,
    over_budget,
    project,
    rehearse,
    workload_dict,
)

PERMISSION = "cutover.coordinate_cutover"
DOMAIN = "nexuscrm.cutover.evidence.v1"
# Barrier order: authoring first (no account appears or leaves meanwhile), then ingress, then new roots.
BARRIER_ORDER = (BarrierKind.AUTHORING, BarrierKind.INGRESS, BarrierKind.ROOT_OUTBOUND)
BUDGET_PHASES = ("barrier_closure", "drain", "baseline_capture", "recovery_point_capture", "restore_rehearsal",
                 "offline_validation", "activation_readback", "full_restore")
IN_FLIGHT = "io_may_have_started"


# -- helpers --------------------------------------------------------------------------------------------------

def canon(value):
    """JSON-shaped values as canonical-encoder values (dicts as key-sorted Records, floats as text)."""
    if isinstance(value, dict):
        return Record([(str(k), canon(value[k])) for k in sorted(value)])
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, str):
        return str(value)
    return value


def evidence_digest(kind: str, value) -> tuple[bytes, bytes]:
    payload = encode(DOMAIN, Record([("kind", kind), ("value", canon(value))]))
    return payload, hashlib.sha256(payload).digest()


def require_coordinator(actor: Actor) -> None:
    if actor.user is not None and not actor.user.has_perm(PERMISSION):
        raise PermissionRefused(f"{actor} lacks the {PERMISSION} permission")


def attempt_get(attempt_key: str, *, lock: bool = False) -> ServiceCutoverAttempt:
    # Neither the configuration's payload nor the epoch's preimage (both grow with the account set: 170 MB
    # together at 100,000 accounts) is read by a phase; a reader that needs one loads it (deferred, D-285).
    rows = ServiceCutoverAttempt.objects.select_related("configuration", "candidate_epoch").defer(
        "configuration__payload", "candidate_epoch__preimage")
    attempt = (rows.select_for_update(of=("self",)) if lock else rows).filter(attempt_key=attempt_key).first()
    if attempt is None:
        raise CutoverPhaseRefused(f"no service cutover attempt {attempt_key!r}")
    return attempt


def require_open(attempt: ServiceCutoverAttempt) -> None:
    if attempt.outcome != AttemptOutcome.OPEN:
        raise CutoverPhaseRefused(f"attempt {attempt.attempt_key} is closed ({attempt.outcome})")


def account_set(configuration: ServiceConfigurationGeneration) -> list[tuple[int, str]]:
    """The configuration's exhaustive account set: (account id, account key), ascending id."""
    return sorted(configuration.accounts.values_list("account_id", "account__account_key"))


def account_set_digest(configuration: ServiceConfigurationGeneration) -> bytes:
    return evidence_digest("account_set", [[i, k] for i, k in account_set(configuration)])[1]


def attempt_account_keys(attempt: ServiceCutoverAttempt) -> list[str]:
    return [k for _, k in account_set(attempt.configuration)]


def frozen_gates(attempt: ServiceCutoverAttempt) -> list[AccountServingGate]:
    """Lock every gate of the frozen account set (ascending account id) after rereading the configuration and
    the gate repository: exactly one gate per account, the set unchanged, and no current account outside it
    (CV2-12-029/031/046/090)."""
    accounts = account_set(attempt.configuration)
    if not hmac.compare_digest(account_set_digest(attempt.configuration), bytes(attempt.account_set_digest)):
        raise CutoverPhaseRefused("the configuration's account set differs from the attempt's frozen set")
    outside = ConnectorAccount.objects.exclude(pk__in=[i for i, _ in accounts]).values_list("account_key", flat=True)
    if outside.exists():
        raise CutoverPhaseRefused("accounts outside the frozen set exist: " + ", ".join(list(outside[:10])))
    gates = connector_locks.gates_for_update([i for i, _ in accounts])
    if [g.account_id for g in gates] != [i for i, _ in accounts]:
        raise CutoverPhaseRefused("the gate set is not one-to-one with the frozen account set")
    return gates


def gates_move(gates: list[AccountServingGate], *, source: str, action: str, actor: Actor,
               attempt: ServiceCutoverAttempt, evidence: bytes | None) -> int:
    """Every frozen gate still in `source` takes `action`, set-based (one UPDATE, one audit INSERT;
    connector gates_advance, D-208); the edge is the django-fsm declaration's, which must start at `source`."""
    if fsm_edge(getattr(AccountServingGate, action))[0] != source:
        raise CutoverPhaseRefused(f"{action} does not start at {source}")
    return len(gates_advance(gates=gates, action=action, actor=actor, evidence_digest=evidence,
                             reason=f"service cutover {attempt.attempt_key}"))


def modes_of(gates) -> set[str]:
    return {g.mode for g in gates}


def receipt_verify(receipt: OwnerReceipt, attempt: ServiceCutoverAttempt, kind: str, subject: str) -> None:
    if (receipt.attempt_key != attempt.attempt_key or receipt.kind != kind or receipt.subject != subject
            or not hmac.compare_digest(hashlib.sha256(receipt.payload).digest(), receipt.digest)):
        raise CutoverPhaseRefused(f"owner receipt {receipt.kind}/{receipt.subject} does not name attempt "
                                  f"{attempt.attempt_key} and {kind}/{subject} exactly (CV2-12-028)")


ORDERING_PLAN_REFUSED = "ordering_plan_refused"  # a route without a checked ordering disposition (D-311)


def _refuse(problems: list[tuple[str, str]]) -> None:
    """Refuse preflight with every problem's detail and its stable reason code (`context["reasons"]`); any ordering
    problem makes it an OrderingPlanRefused (a CutoverPreflightRefused) naming each route's reason code."""
    if problems:
        refusal = OrderingPlanRefused if any(r == ORDERING_PLAN_REFUSED for r, _ in problems) \
            else CutoverPreflightRefused
        raise refusal("; ".join(d for _, d in problems), reasons=sorted({r for r, _ in problems}))


# -- 1. preflight ----------------------------------------------------------------------------------------------

def cutover_open(*, attempt_key: str, configuration_generation_id: str, candidate_epoch_id: str,
                 actor: Actor) -> ServiceCutoverAttempt:
    """Open the attempt: the exact configuration, the verified candidate epoch, the running V1 generation and the
    exhaustive account set. Idempotent for the same inputs; another open attempt refuses."""
    require_coordinator(actor)
    existing = ServiceCutoverAttempt.objects.filter(attempt_key=attempt_key).first()
    if existing is not None:
        return existing
    configuration = ServiceConfigurationGeneration.objects.filter(generation_id=configuration_generation_id).first()
    epoch = ServingEpoch.objects.filter(epoch_id=candidate_epoch_id).first()
    if configuration is None or epoch is None:
        raise CutoverPreflightRefused("the configuration generation or candidate epoch does not exist")
    if epoch.state != EpochState.VERIFIED or epoch.configuration_id != configuration.pk:
        raise CutoverPreflightRefused(f"epoch {epoch.epoch_id} must be verified (offline) for exactly this "
                                      f"configuration; it is {epoch.state}")
    generation = v1_owner().current_generation()
    if generation is None or generation.state != "running":
        raise CutoverPreflightRefused("no running V1 process generation to freeze")
    accounts = account_set(configuration)
    # Refused at preflight, before any V1 barrier closes: the activation would refuse this account set (D-210).
    serving.activation_cardinality_check(accounts=len(accounts))
    with transaction.atomic():
        if ServiceCutoverAttempt.objects.filter(outcome=AttemptOutcome.OPEN).exists():
            raise CutoverPreflightRefused("another service cutover attempt is open")
        attempt = ServiceCutoverAttempt.objects.create(
            attempt_key=attempt_key, configuration=configuration, candidate_epoch=epoch,
            candidate_epoch_digest=bytes(epoch.digest), v1_release_id=generation.release_id,
            v1_generation_id=generation.generation_id, account_set_digest=account_set_digest(configuration),
            account_count=len(accounts), opened_by=str(actor))
        audit_record(actor=actor, entity=attempt, action="cutover_open", to_state=AttemptOutcome.OPEN,
                     evidence_digest=bytes(attempt.account_set_digest))
    return attempt


def cutover_certify(*, attempt_key: str, budgets: dict[str, float], actor: Actor) -> CutoverReadinessCertificate:
    """Preflight and the immutable CutoverReadinessCertificate (CV2-12-012..017, CV2-12-087/088). Refuses an
    `unsupported` route, a route without a lossless halt contract or remediation owner, an unsupported egress
    manifest, a missing or non-positive budget, and any projection over its budget."""
    require_coordinator(actor)
    attempt = attempt_get(attempt_key)
    require_open(attempt)
    existing = CutoverReadinessCertificate.objects.filter(attempt=attempt).first()
    if existing is not None:
        return existing
    owner = v1_owner()
    problems: list[tuple[str, str]] = []  # (stable reason code, detail)
    routes = owner.route_contracts()
    # Every route's ordering disposition, checked against the frozen configuration and candidate epoch (D-311).
    entries, ordering = ordering_plan.plan(configuration=attempt.configuration, epoch=attempt.candidate_epoch,
                                           routes=routes)
    problems += [(ORDERING_PLAN_REFUSED, p) for p in ordering]
    for route in routes:
        if not route.lossless_halt:
            problems.append(("route_unsupported", f"route {route.route_key}: no lossless root halt contract"))
        if not route.remediation_owner:
            problems.append(("route_unsupported", f"route {route.route_key}: no remediation owner"))
    if not routes:
        problems.append(("route_unsupported", "no route dispositions"))
    manifest = owner.egress_manifest()
    if not manifest.supported:
        problems.append(("egress_manifest_unsupported",
                         "egress manifest unsupported: untracked " + ", ".join(manifest.untracked or ("-",))))
    missing = [p for p in BUDGET_PHASES if not isinstance(budgets.get(p), (int, float)) or budgets[p] <= 0]
    if missing:
        problems.append(("budget_missing", "budgets missing or not positive: " + ", ".join(missing)))
    _refuse(problems)  # before anything is measured or rehearsed
    workload, problems = measure(attempt, owner, attempt_account_keys(attempt))
    problems = [(OWNER_UNREADABLE, p) for p in problems]
    try:
        rehearsal = rehearse(attempt.attempt_key)
    except (RestorePointInvalid, RestorePointRefused) as exc:
        problems.append((REHEARSAL_FAILED, f"{REHEARSAL_FAILED}: {exc.detail}"))
        _refuse(problems)
    projections = project(workload, budgets, rehearsal)
    problems += [(over_budget(p), f"projection {p} {projections[p]:.1f}s over budget {budgets[p]}s")
                 for p in BUDGET_PHASES if projections[p] > budgets[p]]
    _refuse(problems)
    release = owner.release()
    value = {
        "attempt": attempt.attempt_key, "epoch_id": attempt.candidate_epoch.epoch_id,
        "epoch_digest": bytes(attempt.candidate_epoch_digest).hex(),
        "configuration": attempt.configuration.generation_id,
        "account_set_digest": bytes(attempt.account_set_digest).hex(),
        "v1_release": [release.release_id, release.binary_digest.hex(), release.schema_digest.hex(),
                       release.configuration_digest.hex()],
        "v1_generation": attempt.v1_generation_id, "egress_manifest": manifest.digest.hex(),
        "routes": entries,
        "budgets": {p: float(budgets[p]) for p in BUDGET_PHASES},
        "measurements": {**workload_dict(workload), "rehearsal": rehearsal},
        "projections": projections, "reason_map": CUTOVER_REASONS,
        "v2_schema": v2_artifacts.schema_digest().hex(), "v2_binary": v2_artifacts.binary_digest().hex(),
    }
    payload, digest = evidence_digest("readiness_certificate", value)
    with transaction.atomic():
        certificate = CutoverReadinessCertificate.objects.create(
            attempt=attempt, epoch_id=value["epoch_id"], epoch_digest=bytes(attempt.candidate_epoch_digest),
            configuration_generation_id=value["configuration"], v1_release_id=release.release_id,
            egress_manifest_digest=manifest.digest, v2_schema_digest=bytes.fromhex(value["v2_schema"]),
            v2_binary_digest=bytes.fromhex(value["v2_binary"]), routes=value["routes"], budgets=value["budgets"],
            measurements=value["measurements"], projections=projections, reason_map=CUTOVER_REASONS,
            payload=payload, digest=digest)
        audit_record(actor=actor, entity=attempt, action="cutover_certify", evidence_digest=digest)
    return certificate


def certificate_locked(attempt: ServiceCutoverAttempt) -> CutoverReadinessCertificate:
    """Lock the certificate and byte-compare it with its digest (CV2-12-031)."""
    certificate = CutoverReadinessCertificate.objects.select_for_update().filter(attempt=attempt).first()
    if certificate is None:
        raise CutoverPhaseRefused(f"attempt {attempt.attempt_key} has no readiness certificate")
    if not hmac.compare_digest(hashlib.sha256(bytes(certificate.payload)).digest(), bytes(certificate.digest)):
        raise CutoverPhaseRefused("the readiness certificate's bytes do not match its digest")
    return certificate
