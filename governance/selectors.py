"""Read paths of the operator screens: the approval queue, the quarantine and halt board, pending attestations
and the overview. Read-only; every item links to its evidence (an admin changelist filtered to exactly the rows
behind it) and to its decision page."""
from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.db.models.functions import TruncMinute
from django.urls import reverse
from django.utils import timezone

from connector.selectors.lanes import execution_remedy, lane_halt_fact, replay_outlook
from connector.selectors.rows import (
    AccountServingGate,
    ApplicationResult,
    ConnectorAccount,
    CredentialGenerationDispatchGate,
    DualApprovalRequest,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    Receipt,
    ReceiptComponent,
)
from cutover.selectors import ServiceCutoverAttempt, V1GenerationReceipt
from effects.selectors import DeliveryOperation, DispatchPermit, MutationGate, ReceiverCertification, RemoteEffect
from effects.services.delivery.setup import certification_subject_digest
from effects.services.recovery import NO_PROOF, effect_recovery_outlook
from observability import readings

from .items import Item
from .poison import poison_items
from .reasons import Remedy, reason
from .attempts import in_flight

WAITING_DELIVERY = r"^(final_unknown|final_partial|final_full_unverified|reconciling_)"


def _admin(model: str, **filters) -> str:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return reverse(f"admin:{model}_changelist") + (f"?{query}" if query else "")


# -- sources: each lists the halted or quarantined items of one kind --------------------------------------------

def _effect(e: RemoteEffect, code: str) -> Item:
    return Item("effect", e.pk, f"Effect #{e.pk} {e.command}", e.state, code, e.changed_at,
                _admin("effects_remoteeffect", id=e.pk), reverse("governance:effect", args=[e.pk]))


def uncertain_effects() -> list[Item]:
    """Uncertain effects: waiting for a person (EFFECT_UNCERTAIN without the proof of a safe repeat, or the hold
    of a stopped automatic recovery), or on the board only while the product repeats them itself under their
    frozen idempotency contract (UNCERTAIN_REPEAT_SCHEDULED, with the time the repeat is due; D-430)."""
    items = []
    for e in RemoteEffect.objects.select_related("command").filter(state="uncertain"):
        outlook = effect_recovery_outlook(e)
        if outlook.kind == NO_PROOF:
            items.append(_effect(e, "EFFECT_UNCERTAIN"))
        elif outlook.code:
            items.append(_effect(e, outlook.code))
        else:
            items.append(dataclasses.replace(_effect(e, "UNCERTAIN_REPEAT_SCHEDULED"), hint=(
                f"repeated under its frozen idempotency key at {outlook.due_at:%Y-%m-%d %H:%M:%S} UTC: "
                f"{outlook.detail}")))
    return items


def quarantined_effects() -> list[Item]:
    return [_effect(e, e.quarantine_reason or "OPERATOR_QUARANTINE")
            for e in RemoteEffect.objects.select_related("command").filter(state="quarantined")]


def link_conflicts() -> list[Item]:
    """Effects proven remotely whose finalization failed closed on a RemoteLink conflict (still nonterminal)."""
    return [_effect(e, e.quarantine_reason) for e in RemoteEffect.objects.select_related("command")
            .filter(state="remote_confirmed").exclude(quarantine_reason="")]


def ended_effects() -> list[Item]:
    """Effects the frozen policy ended terminal `no_effect` with a closed reason code (issue 37, D-423), until a new
    remote call for their root and slot was authorized (the successor carries on from there)."""
    return [_effect(e, e.quarantine_reason) for e in RemoteEffect.objects.select_related("command")
            .filter(state="no_effect", successor_intents__isnull=True).exclude(quarantine_reason="")]


def quarantined_executions() -> list[Item]:
    """Quarantined executions still waiting for their remedy (one already replayed, or passed by a lane resume,
    is followed through its successor fact instead), each with whether a replay would run now."""
    items = []
    for x in Execution.objects.select_related("projection", "lane").filter(state="quarantined"):
        if execution_remedy(x):
            continue
        outlook = replay_outlook(x)
        items.append(Item("execution", x.pk, f"Execution #{x.pk} (generation {x.generation})", x.state,
                          x.quarantine_reason, x.changed_at, _admin("connector_execution", id=x.pk),
                          reverse("governance:execution", args=[x.pk]),
                          ("Replay runs: " if outlook.runs else "Replay would not run: ") + outlook.why))
    return items


def halted_lanes() -> list[Item]:
    """Halted lanes, timed by the fact that halted them (gap decision or quarantined execution)."""
    items = []
    for lane in OrderingLane.objects.filter(state="halted"):
        fact = lane_halt_fact(lane)
        items.append(Item("lane", lane.pk, f"Lane #{lane.pk} {lane.route}/{lane.partition}", lane.state,
                          lane.halt_reason, fact.at if fact else lane.changed_at,
                          _admin("connector_orderinglane", id=lane.pk), reverse("governance:lane", args=[lane.pk]),
                          f"halted by {fact.what}" if fact else ""))
    return items


def quarantined_components() -> list[Item]:
    return [Item("component", c.pk, f"Receipt #{c.receipt_id} component {c.ordinal}", c.disposition,
                 c.reason_code or "EVENT_KEY_CONFLICT", c.receipt.created_at,
                 _admin("connector_receipt", id=c.receipt_id))
            for c in ReceiptComponent.objects.select_related("receipt").filter(disposition="quarantined")]


def halted_gates() -> list[Item]:
    return [Item("gate", g.pk, f"Gate of {g.account}", g.mode, "GATE_HALTED", g.changed_at,
                 _admin("connector_accountservinggate", mode=g.mode))
            for g in AccountServingGate.objects.select_related("account").filter(mode__in=["halting_v2",
                                                                                         "v2_halted"])]


def revoked_credential_gates() -> list[Item]:
    return [Item("credential_gate", g.pk, f"Credential gate #{g.pk}", g.mode, "CREDENTIAL_REVOKED", g.changed_at,
                 _admin("connector_credentialgenerationdispatchgate", mode="revoked"))
            for g in CredentialGenerationDispatchGate.objects.filter(mode="revoked")]


def blocked_delivery_gates() -> list[Item]:
    return [Item("delivery_gate", g.pk, f"Delivery mutation gate ({g.blocked_reason})", g.state,
                 "DELIVERY_GATE_BLOCKED", g.changed_at, _admin("effects_mutationgate"))
            for g in MutationGate.objects.filter(state="BLOCKED")]


def waiting_deliveries() -> list[Item]:
    return [Item("delivery", o.pk, f"Delivery #{o.pk} {o.parent.parent_key}/{o.ordinal}", o.state,
                 o.last_code or "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN", o.changed_at,
                 _admin("effects_deliveryoperation", id=o.pk), reverse("governance:delivery", args=[o.pk]))
            for o in DeliveryOperation.objects.select_related("parent").filter(state__regex=WAITING_DELIVERY)
            .exclude(reconciled=True, state__startswith="final_")]


def v1_reconciliations() -> list[Item]:
    """V1 effect rows of an open service cutover in `v1_stopped` whose provider call may have started: each needs
    a fenced reconciliation with the provider's evidence before the shutdown certificate (CV2-12-040)."""
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


# Every kind of halted or quarantined item. A new quarantine reason adds its reason (reasons.py), its remedy and,
# for a new kind of item, a source here: the board and the queue pick it up from there.
SOURCES: tuple[Callable[[], list[Item]], ...] = (
    uncertain_effects, quarantined_effects, link_conflicts, ended_effects, quarantined_executions, halted_lanes,
    quarantined_components, halted_gates, revoked_credential_gates, blocked_delivery_gates, waiting_deliveries,
    v1_reconciliations,
    poison_items,  # held receipts and deliveries, quarantined windows, epochs not verified (D-168)
)


def board() -> dict[str, list[Item]]:
    """Every halted or quarantined item grouped by its closed reason code, oldest first in each group."""
    grouped: dict[str, list[Item]] = defaultdict(list)
    for source in SOURCES:
        for item in source():
            grouped[item.code].append(item)
    return {code: sorted(items, key=lambda i: i.since) for code, items in sorted(grouped.items())}


def queue() -> list[Item]:
    """Everything waiting for a human, oldest first: every board item whose reason's remedy is a person's action
    (uncertain and conflicting effects, quarantined executions, halted partitions, delivery operations to
    reconcile, V1 effects to reconcile, a blocked delivery journal), each with its owner, alert deadline, evidence
    and action. Terminal reasons and deliberate operator states (a halted gate, a revoked credential) stay on the
    board only."""
    return sorted((item for items in board().values() for item in items if item.remedy.queue),
                  key=lambda i: i.since)


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
                       "attestations": len(attestations()) + DualApprovalRequest.objects.filter(state="pending")
                       .count(), "delivery_waiting": DeliveryOperation.objects.filter(
                           state__regex=WAITING_DELIVERY).count()}}


# -- where work waits: the overview's pictures and stuck work, and why a receipt has not materialized (issue 21) ---

def pipeline(now: datetime | None = None) -> dict:
    """The overview's pipeline section: each stage's backlog over the last hour (observability's stage samples),
    throughput per stage and minute, and the stuck items (older than their stage's budget)."""
    from django.conf import settings

    now = now or timezone.now()
    since = now - timedelta(hours=1)
    start = since.replace(second=0, microsecond=0)
    minutes = [start + timedelta(minutes=i) for i in range(61)]

    def per_minute(queryset, field: str) -> list[int]:
        found = dict(queryset.filter(**{f"{field}__gte": since}).annotate(m=TruncMinute(field))
                     .values_list("m").annotate(n=Count("pk")).order_by())
        return [found.get(m, 0) for m in minutes]

    throughput = {
        "admitted": per_minute(Receipt.objects.all(), "created_at"),
        "materialized": per_minute(Projection.objects.all(), "created_at"),
        "completed": per_minute(ApplicationResult.objects.all(), "committed_at"),
        "effects finalized": per_minute(RemoteEffect.objects.filter(state="finalized"), "changed_at"),
    }
    budgets = settings.CONNECTOR.get("STAGE_BUDGETS_SECONDS", {})
    return {"minutes": minutes, "throughput": throughput, "history": readings.stage_history(since=since),
            "now": {b.stage: (b.count, b.age(now)) for b in readings.backlogs(now)},
            "stuck": readings.stuck(budgets, now=now), "budgets": budgets, "since": since}


@dataclass(frozen=True)
class ReceiptStatus:
    state: str  # materialized | waiting | held | gate_closed
    why: str
    remedy: Remedy | None = None


def receipt_status(receipt: Receipt, *, now: datetime | None = None) -> ReceiptStatus:
    """Why a receipt has (not yet) materialized, from its work-queue row, its account's gate and its stage budget."""
    from django.conf import settings

    now = now or timezone.now()
    due = MaterializationDue.objects.filter(receipt=receipt).first()
    if due is None:
        return ReceiptStatus("materialized", f"Materialized: {receipt.events.count()} event(s), "
                                             f"{receipt.components.count()} component(s) recorded.")
    if due.held_reason:
        held = reason(due.held_reason)
        return ReceiptStatus("held", f"Held since {due.held_at:%Y-%m-%d %H:%M:%S} with {due.held_reason}: "
                                     f"{held.title}. The sweeper skips it until the hold is released.",
                             held.remedy)
    gate = AccountServingGate.objects.filter(account_id=receipt.account_id).only("mode", "fence").first()
    if gate is None or gate.mode != "v2_serving":
        return ReceiptStatus("gate_closed", f"The account's gate is {gate.mode if gate else 'absent'}: "
                                            "materialization waits until the gate serves V2 again (the receipt is "
                                            "durable; nothing is lost).")
    waited = (now - receipt.created_at).total_seconds()
    budget = settings.CONNECTOR.get("STAGE_BUDGETS_SECONDS", {}).get("materialization_due", 60)
    if waited > budget:
        return ReceiptStatus("waiting", f"Waiting {waited:.0f} s, past the {budget} s budget: the materialize "
                                        "workers have not taken it. Check that they run (worker liveness, /readyz) "
                                        "and that the broker is reachable; the inbound sweeper finds it every 5 s "
                                        "even without a wake-up.")
    return ReceiptStatus("waiting", f"Waiting {waited:.0f} s for the materialize workers (budget {budget} s).")
