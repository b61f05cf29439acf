"""The delivery journal's mutation gate (contract `mutation_gate`) and journal epochs.

The gate is ENABLED by default. It blocks after a restore or failover without proven zero RPO (declared by the
restore tooling or an operator), on a journal epoch mismatch (the newest JournalEpochAttestation, kept in the
`journal` database outside what a restore of `default` replaces, differs from the gate's epoch: a restored
`default` lags it), and on a MAY_ATTEMPT marker without its journal attempt. It unblocks only with a completed
reconciliation campaign, an approval by a user holding `effects.approve_journal_epoch`, and a new journal epoch
attestation.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import Exists
from django.utils import timezone

from connector.actors import Actor
from connector.selectors.locks import share_one as _share_one
from connector.selectors.serving import provider_io_held_epochs
from connector.services.audit import audit_record
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryError, DeliveryPermissionDenied, DeliveryRequestInvalid
from effects.models import JournalEpochAttestation, MayAttemptMarker, MutationGate, ReconciliationCampaign
from effects.choices import GateState
from effects.errors import ProviderIoHeld

log = logging.getLogger(__name__)
BLOCK_REASONS = tuple(contract().raw["mutation_gate"]["blocked_after"])
SYSTEM = Actor.system("delivery-journal")


def gate_row() -> MutationGate:
    gate = MutationGate.objects.filter(singleton=True).first()
    if gate is None:
        gate, _ = MutationGate.objects.get_or_create(singleton=True)
    return gate


def attested_epoch() -> int:
    """The newest attested journal epoch (the genesis attestation, epoch 1, is written on first use)."""
    latest = JournalEpochAttestation.objects.order_by("-epoch").first()
    if latest is None:
        latest, _ = JournalEpochAttestation.objects.get_or_create(
            epoch=1, defaults={"reason": "genesis", "attested_by": str(SYSTEM)})
    return latest.epoch


def gate_block(*, reason: str, detail: str, actor: Actor = SYSTEM) -> MutationGate:
    if reason not in BLOCK_REASONS:
        raise DeliveryRequestInvalid(f"blocking reason must be one of {BLOCK_REASONS}")
    gate_row()
    with transaction.atomic():
        gate = MutationGate.objects.select_for_update().get(singleton=True)
        before = gate.state
        gate.block(reason=reason, detail=detail)
        gate.save()
        audit_record(actor=actor, entity=gate, action="delivery_gate_block", from_state=before, to_state=gate.state,
                     reason=f"{reason}: {detail}")
    log.warning("delivery mutation gate blocked", extra={"reason": reason, "detail": detail})
    return gate


def gate_guard_for_share() -> MutationGate:
    """Inside a submit transaction: the gate FOR SHARE, ENABLED, at the attested journal epoch, and no first
    activation awaiting its readback (ProviderIoHeld, D-321). A mismatch blocks the gate (in its own committed
    transaction, after this one rolls back) and refuses."""
    gate_row()
    attested = attested_epoch()
    # A first activation not yet read back holds all provider I/O (CV2-12-071, D-321): read in the same statement
    # as the gate's share lock, no round trip added.
    gate = _share_one(MutationGate.objects.filter(singleton=True).annotate(
        provider_io_held=Exists(provider_io_held_epochs())))
    if gate.provider_io_held:
        raise ProviderIoHeld("a service cutover's first activation is not read back yet; provider I/O is disabled "
                             "(no REST delivery submit or request starts)")
    if gate.state != GateState.ENABLED:
        raise DeliveryError("REST_DELIVERY_JOURNAL_EPOCH_BLOCKED",
                            f"the delivery mutation gate is blocked ({gate.blocked_reason})", block=None)
    if gate.journal_epoch != attested:
        raise DeliveryError("REST_DELIVERY_JOURNAL_EPOCH_BLOCKED",
                            f"journal epoch mismatch: this database says {gate.journal_epoch}, the journal "
                            f"attests {attested}", block=("journal_epoch_mismatch",
                                                          f"gate {gate.journal_epoch} != attested {attested}"))
    return gate


def markers_without_attempts() -> list[int]:
    return list(MayAttemptMarker.objects.filter(attempt__isnull=True).values_list("pk", flat=True))


def journal_audit() -> list[str]:
    """Find what blocks the gate (marker without attempt, epoch mismatch) and block it. Returns the findings."""
    findings = []
    orphans = markers_without_attempts()
    if orphans:
        findings.append(f"MAY_ATTEMPT markers without journal attempts: {orphans}")
        gate_block(reason="pre_attempt_marker_without_matching_journal_attempt", detail=str(orphans))
    gate = gate_row()
    attested = attested_epoch()
    if gate.journal_epoch != attested:
        findings.append(f"journal epoch mismatch: gate {gate.journal_epoch}, attested {attested}")
        if gate.state == GateState.ENABLED:
            gate_block(reason="journal_epoch_mismatch", detail=findings[-1])
    return findings


def attest_epoch(*, epoch: int, reason: str, actor: Actor, campaign_id: str = "") -> JournalEpochAttestation:
    """Write a journal epoch attestation in the journal database (the restore tooling does this when it
    restores `default`; `gate_unblock` does it for the new epoch)."""
    with transaction.atomic(using="journal"):
        return JournalEpochAttestation.objects.create(epoch=epoch, reason=reason, attested_by=str(actor),
                                                      campaign_id=campaign_id)


def campaign_start(*, actor: Actor, campaign_id: str, reason: str) -> ReconciliationCampaign:
    with transaction.atomic():
        campaign = ReconciliationCampaign.objects.create(campaign_id=campaign_id, reason=reason,
                                                         started_by=actor.user)
        audit_record(actor=actor, entity=campaign, action="delivery_campaign_start", reason=reason)
    return campaign


def campaign_complete(*, actor: Actor, campaign: ReconciliationCampaign, findings: list) -> ReconciliationCampaign:
    with transaction.atomic():
        locked = ReconciliationCampaign.objects.select_for_update().get(pk=campaign.pk)
        if locked.completed_at is not None:
            raise DeliveryRequestInvalid("the campaign is already complete")
        locked.findings = findings
        locked.completed_at = timezone.now()
        locked.save()
        audit_record(actor=actor, entity=locked, action="delivery_campaign_complete", reason=str(len(findings)))
    return locked


def gate_unblock(*, actor: Actor, campaign: ReconciliationCampaign) -> MutationGate:
    """Reopen the gate: a completed campaign, an approving user (not the campaign's starter), and a new journal
    epoch attested in the journal database, then adopted here."""
    if actor.user is None or not actor.user.has_perm("effects.approve_journal_epoch"):
        raise DeliveryPermissionDenied(f"{actor} lacks permission effects.approve_journal_epoch")
    campaign = ReconciliationCampaign.objects.get(pk=campaign.pk)
    if campaign.started_by_id == actor.user.pk:
        raise DeliveryPermissionDenied("the campaign's starter cannot approve its own unblock")
    if campaign.completed_at is None:
        raise DeliveryRequestInvalid("the reconciliation campaign has not completed")
    if markers_without_attempts():
        raise DeliveryRequestInvalid("MAY_ATTEMPT markers without attempts remain")
    gate = gate_row()
    if gate.state != GateState.BLOCKED:
        raise DeliveryRequestInvalid("the gate is not blocked")
    new_epoch = max(gate.journal_epoch, attested_epoch()) + 1
    attest_epoch(epoch=new_epoch, reason="unblock", actor=actor, campaign_id=campaign.campaign_id)
    with transaction.atomic():
        gate = MutationGate.objects.select_for_update().get(singleton=True)
        gate.unblock(journal_epoch=new_epoch)
        gate.save()
        audit_record(actor=actor, entity=gate, action="delivery_gate_unblock", from_state="BLOCKED",
                     to_state=gate.state, reason=f"epoch {new_epoch}, campaign {campaign.campaign_id}")
    return gate
