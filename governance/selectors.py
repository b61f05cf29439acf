"""Read paths of the operator screens: the approval queue, the quarantine and halt board, pending attestations
and the overview. Read-only; every item links to its evidence (an admin changelist filtered to exactly the rows
behind it) and to its decision page."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.db.models.functions import TruncMinute
from django.urls import reverse
from django.utils import timezone

from connector.models import (
    AccountServingGate,
    ApplicationResult,
    ConnectorAccount,
    CredentialGenerationDispatchGate,
    Execution,
    OrderingLane,
    Receipt,
    ReceiptComponent,
)
from effects.models import DeliveryOperation, DispatchPermit, MutationGate, ReceiverCertification, RemoteEffect
from effects.services.delivery.setup import certification_subject_digest

from .poison import poison_items
from .reasons import Reason, reason

WAITING_DELIVERY = r"^(final_unknown|final_partial|final_full_unverified|reconciling_)"


@dataclass(frozen=True)
class Item:
    kind: str  # effect | delivery | execution | lane | component | gate | credential_gate | delivery_gate
    pk: int
    title: str
    state: str
    code: str
    since: datetime
    evidence_url: str  # the admin rows behind it
    decide_url: str = ""  # the decision page, where a human decision is possible here

    @property
    def reason(self) -> Reason:
        return reason(self.code)

    @property
    def deadline(self) -> datetime:
        return self.since + self.reason.deadline

    @property
    def overdue(self) -> bool:
        return timezone.now() > self.deadline


def _admin(model: str, **filters) -> str:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return reverse(f"admin:{model}_changelist") + (f"?{query}" if query else "")


def queue() -> list[Item]:
    """Everything waiting for a human: uncertain remote effects (a decision), quarantined effects and executions
    (a remediation by their owner: a new intent, a replay or a corrected generation), and delivery operations in
    an unknown, partial, unverified or reconciling tuple. Oldest first."""
    items = [Item("effect", e.pk, f"Effect #{e.pk} {e.command}", e.state, "EFFECT_UNCERTAIN", e.changed_at,
                  _admin("effects_remoteeffect", id=e.pk), reverse("governance:effect", args=[e.pk]))
             for e in RemoteEffect.objects.select_related("command").filter(state="uncertain")]
    items += [Item("effect", e.pk, f"Effect #{e.pk} {e.command}", e.state, e.quarantine_reason or
                   "OPERATOR_QUARANTINE", e.changed_at, _admin("effects_remoteeffect", id=e.pk),
                   reverse("governance:effect", args=[e.pk]))
              for e in RemoteEffect.objects.select_related("command").filter(state="quarantined")]
    items += [Item("execution", x.pk, f"Execution #{x.pk} (generation {x.generation})", x.state,
                   x.quarantine_reason, x.changed_at, _admin("connector_execution", id=x.pk),
                   reverse("governance:execution", args=[x.pk]))
              for x in Execution.objects.filter(state="quarantined")]
    items += [Item("delivery", o.pk, f"Delivery #{o.pk} {o.parent.parent_key}/{o.ordinal}", o.state,
                   o.last_code or "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN", o.changed_at,
                   _admin("effects_deliveryoperation", id=o.pk), reverse("governance:delivery", args=[o.pk]))
              for o in DeliveryOperation.objects.select_related("parent").filter(state__regex=WAITING_DELIVERY)
              .exclude(reconciled=True, state__startswith="final_")]
    items += v1_reconciliations()
    return sorted(items, key=lambda i: i.since)


def v1_reconciliations() -> list[Item]:
    """V1 effect rows of an open service cutover in `v1_stopped` whose provider call may have started: each needs
    a fenced reconciliation with the provider's evidence before the shutdown certificate (CV2-12-040)."""
    from cutover.models import ServiceCutoverAttempt, V1GenerationReceipt

    from .attempts import in_flight

    found = []
    for attempt in ServiceCutoverAttempt.objects.filter(outcome="open").select_related("configuration"):
        stopped = V1GenerationReceipt.objects.filter(attempt=attempt).order_by("pk").first()
        if stopped is None:
            continue
        found += [Item("v1_effect", int(row.row_id), f"V1 effect #{row.row_id} ({row.detail})", "io_may_have_started",
                       "V1_IO_MAY_HAVE_STARTED", stopped.created_at, _admin("v1_v1outboundeffect", id=row.row_id),
                       reverse("governance:attempt", args=[attempt.attempt_key]) + "#ph-reconcile")
                  for row in in_flight(attempt)]
    return found


def board() -> dict[str, list[Item]]:
    """Every halted or quarantined item grouped by its closed reason code (the queue's items included)."""
    items = list(queue())
    items += [Item("effect", e.pk, f"Effect #{e.pk}", e.state, e.quarantine_reason, e.changed_at,
                   _admin("effects_remoteeffect", quarantine_reason=e.quarantine_reason),
                   reverse("governance:effect", args=[e.pk]))
              for e in RemoteEffect.objects.exclude(state="quarantined").exclude(quarantine_reason="")]
    items += [Item("lane", lane.pk, f"Lane #{lane.pk} {lane}", lane.state, lane.halt_reason, lane.changed_at,
                   _admin("connector_orderinglane", state="halted"))
              for lane in OrderingLane.objects.filter(state="halted")]
    items += [Item("component", c.pk, f"Receipt #{c.receipt_id} component {c.ordinal}", c.disposition,
                   c.reason_code or "EVENT_KEY_CONFLICT", c.receipt.created_at,
                   _admin("connector_receipt", id=c.receipt_id))
              for c in ReceiptComponent.objects.select_related("receipt").filter(disposition="quarantined")]
    items += [Item("gate", g.pk, f"Gate of {g.account}", g.mode, "GATE_HALTED", g.changed_at,
                   _admin("connector_accountservinggate", mode=g.mode))
              for g in AccountServingGate.objects.select_related("account").filter(mode__in=["halting_v2",
                                                                                              "v2_halted"])]
    items += [Item("credential_gate", g.pk, f"Credential gate #{g.pk}", g.mode, "CREDENTIAL_REVOKED", g.changed_at,
                   _admin("connector_credentialgenerationdispatchgate", mode="revoked"))
              for g in CredentialGenerationDispatchGate.objects.filter(mode="revoked")]
    items += [Item("delivery_gate", g.pk, f"Delivery mutation gate ({g.blocked_reason})", g.state,
                   "DELIVERY_GATE_BLOCKED", g.changed_at, _admin("effects_mutationgate"))
              for g in MutationGate.objects.filter(state="BLOCKED")]
    items += poison_items()  # held receipts and deliveries, quarantined windows, epochs not verified (D-168)
    grouped: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        grouped[item.code].append(item)
    return dict(sorted(grouped.items()))


@dataclass(frozen=True)
class Attestation:
    certification: ReceiverCertification
    subject_digest: bytes
    approvals: list  # (username, created_at, digest_seen hex, current?)
    requested_by: str


def attestations() -> list[Attestation]:
    """Dual-approval subjects waiting for approvers: platform-attested receiver certifications."""
    out = []
    for cert in ReceiverCertification.objects.select_related("binding", "requested_by").filter(
            assurance_mode="platform_attested", state="pending_approval").order_by("pk"):
        digest = certification_subject_digest(cert)
        approvals = [(a.approver.get_username(), a.created_at, bytes(a.digest_seen).hex(),
                      bytes(a.digest_seen) == digest) for a in cert.approvals.select_related("approver")]
        out.append(Attestation(cert, digest, approvals, cert.requested_by.get_username()))
    return out


def cutover_approvals(*, recent: int = 20) -> list:
    """Dual-approval requests of cutover subjects: every pending one, then the most recent decided ones."""
    from connector.models import DualApprovalRequest

    rows = DualApprovalRequest.objects.select_related("requested_by").prefetch_related("approvals__approver")
    return list(rows.filter(state="pending").order_by("pk")) + list(rows.exclude(state="pending")
                                                                   .order_by("-pk")[:recent])


def recertification_due(*, within: timedelta = timedelta(days=14)) -> list[ReceiverCertification]:
    """Certified identities whose validity ends soon or has ended (periodic recertification), soonest first."""
    horizon = timezone.now() + within
    return list(ReceiverCertification.objects.select_related("binding").filter(
        Q(state="certified", valid_until__lte=horizon) | Q(state="expired")).order_by("valid_until"))


def overview() -> dict:
    """Counts by state per account, the gate and epoch of each, open permits, and admissions/completions per
    minute over the last hour."""
    accounts = []
    executions = defaultdict(Counter)
    for row in Execution.objects.values("account_id", "state").annotate(n=Count("id")):
        executions[row["account_id"]][row["state"]] += row["n"]
    effects = defaultdict(Counter)
    for row in RemoteEffect.objects.values("account_id", "state").annotate(n=Count("id")):
        effects[row["account_id"]][row["state"]] += row["n"]
    receipts = dict(Receipt.objects.values_list("account_id").annotate(n=Count("id")))
    permits = dict(DispatchPermit.objects.filter(state__in=["granted", "sending"]).values_list(
        "effect__account_id").annotate(n=Count("id")))
    for account in ConnectorAccount.objects.select_related("serving_gate", "serving_gate__epoch").order_by("pk"):
        gate = getattr(account, "serving_gate", None)
        accounts.append({"account": account, "gate": gate, "admitted": receipts.get(account.pk, 0),
                         "executions": dict(executions[account.pk]), "effects": dict(effects[account.pk]),
                         "open_permits": permits.get(account.pk, 0)})
    since = timezone.now() - timedelta(hours=1)
    admissions = dict(Receipt.objects.filter(created_at__gte=since).annotate(m=TruncMinute("created_at"))
                      .values_list("m").annotate(n=Count("id")))
    completions = dict(ApplicationResult.objects.filter(committed_at__gte=since)
                       .annotate(m=TruncMinute("committed_at")).values_list("m").annotate(n=Count("id")))
    start = since.replace(second=0, microsecond=0)
    minutes = [start + timedelta(minutes=i) for i in range(61)]
    series = [(m, admissions.get(m, 0), completions.get(m, 0)) for m in minutes]
    return {"accounts": accounts, "series": series,
            "totals": {"queue": len(queue()), "board": sum(len(v) for v in board().values()),
                       "attestations": len(attestations()), "delivery_waiting": DeliveryOperation.objects.filter(
                           state__regex=WAITING_DELIVERY).count()}}
