"""Inbound facts: ReceiptAdmissionKey, Receipt, ReceiptComponent, Event, ReplayRequest and V1 acceptance
tombstones. All are immutable once written (the database refuses UPDATE); every Receipt and its descendants keep
the exact epoch that admitted the Receipt."""
from __future__ import annotations

from django.contrib.postgres.indexes import BrinIndex
from django.db import models
from django.db.models import Q

from connector.choices import ComponentDisposition, ReceiptKind, ReplayMode, StepFailureReason
from connector.models.owners import ConnectorAccount
from connector.models.serving import ServingEpoch

__all__ = ["V1AcceptanceTombstone", "V1PredecessorRef", "ReplayRequest", "Receipt", "ReceiptAdmissionKey",
           "ReceiptComponent", "Event", "MaterializationDue"]


class V1AcceptanceTombstone(models.Model):
    """A non-executable identity of one V1-accepted transport key: payload digest and predecessor ref only, no
    lease, command or state. Invariant: immutable; one per (account, channel, transport key)."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="v1_tombstones")
    channel = models.CharField(max_length=255)
    transport_key = models.CharField(max_length=255)
    payload_digest = models.BinaryField(max_length=32)
    predecessor_ref = models.CharField(max_length=255)
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["account", "channel", "transport_key"],
                                               name="connector_v1tombstone_unique_key")]

    def __str__(self) -> str:
        return f"V1 tombstone {self.transport_key!r}"


class V1PredecessorRef(models.Model):
    """The typed V1 predecessor ref of a replay (CV2-09-002, D-331): read-only lineage evidence of one V1-accepted
    item, never an owner. It names the V1 Receipt (the tombstone's channel and transport key), the V1 Event and
    WorkItem identities, the original V1 epoch (evidence only: no descendant executes under it, CV2-09-014), the
    authorized payload digest and the V1 result digest, under one protocol version. It has no state, lease, fence
    or claim column, and nothing but its ReplayRequest and the replay's Events refers to it. Invariants:
    immutable (the database refuses UPDATE); bound to the exact V1 acceptance tombstone whose identities and
    payload digest it repeats; the original epoch is a V1 identity (`v1:` prefix), never a V2 ServingEpoch."""

    tombstone = models.ForeignKey(V1AcceptanceTombstone, on_delete=models.PROTECT, related_name="+")
    protocol_version = models.CharField(max_length=64)
    v1_receipt_channel = models.CharField(max_length=255)
    v1_receipt_transport_key = models.CharField(max_length=255)
    v1_event_id = models.CharField(max_length=255)
    v1_work_item_id = models.CharField(max_length=255)
    original_epoch = models.CharField(max_length=255)
    payload_digest = models.BinaryField(max_length=32)
    result_digest = models.BinaryField(max_length=32)
    ref_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=Q(original_epoch__startswith="v1:"),
                                   name="connector_v1predecessorref_v1_epoch"),
            models.CheckConstraint(condition=Q(v1_event_id__startswith="v1:event:")
                                   & Q(v1_work_item_id__startswith="v1:workitem:"),
                                   name="connector_v1predecessorref_v1_identities"),
        ]

    def __str__(self) -> str:
        return f"V1 predecessor {self.v1_work_item_id} ({self.original_epoch})"


class ReplayRequest(models.Model):
    """Immutable operator authorization of one replay, never an Event state. Invariant: one per (account,
    request ID); a duplicate submission must byte-match `request_digest`."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="replay_requests")
    request_id = models.CharField(max_length=255)
    target_epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="replay_requests")
    target_epoch_digest = models.BinaryField(max_length=32)
    predecessor_event = models.ForeignKey("connector.Event", on_delete=models.PROTECT, null=True, blank=True,
                                          related_name="+")
    v1_predecessor = models.OneToOneField(V1PredecessorRef, on_delete=models.PROTECT, null=True, blank=True,
                                          related_name="replay_request")
    predecessor_payload_digest = models.BinaryField(max_length=32)
    reason = models.TextField()
    principal = models.CharField(max_length=255)
    mode = models.CharField(max_length=32, choices=ReplayMode.choices)
    request_digest = models.BinaryField(max_length=32)
    gate_fence = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "request_id"], name="connector_replayrequest_unique_id"),
            models.CheckConstraint(condition=Q(mode__in=ReplayMode.values), name="connector_replayrequest_mode"),
            models.CheckConstraint(condition=(Q(predecessor_event__isnull=False, v1_predecessor__isnull=True)
                                              | Q(predecessor_event__isnull=True, v1_predecessor__isnull=False)),
                                   name="connector_replayrequest_one_predecessor"),
        ]

    def __str__(self) -> str:
        return f"replay {self.request_id}"


class Receipt(models.Model):
    """Immutable evidence of one accepted V2 admission: the exact bytes, the admitting epoch and gate fence.
    Invariants: a transport Receipt has one admission key; a replay Receipt has exactly one ReplayRequest."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="receipts")
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="receipts")
    epoch_digest = models.BinaryField(max_length=32)
    gate_fence = models.BigIntegerField()
    kind = models.CharField(max_length=16, choices=ReceiptKind.choices)
    channel = models.CharField(max_length=255)
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    component_count = models.PositiveIntegerField()
    replay_request = models.OneToOneField(ReplayRequest, on_delete=models.PROTECT, null=True, blank=True,
                                          related_name="receipt")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(kind=ReceiptKind.TRANSPORT, replay_request__isnull=True)
                           | Q(kind=ReceiptKind.REPLAY, replay_request__isnull=False)),
                name="connector_receipt_kind_matches_replay"),
        ]
        indexes = [models.Index(fields=["account", "created_at"], name="connector_receipt_acct_time"),
                   # The overview's admissions of the last hour across accounts (issue 21; BRIN, see
                   # ApplicationResult).
                   BrinIndex(fields=["created_at"], name="connector_receipt_time_brin", autosummarize=True, pages_per_range=8)]

    def __str__(self) -> str:
        return f"receipt #{self.pk} ({self.kind}, {self.channel})"


class ReceiptAdmissionKey(models.Model):
    """The sole transport-idempotency authority: one per (account, channel, transport key), bound to exactly one
    V2 Receipt or one V1 acceptance tombstone. Invariant: immutable."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="admission_keys")
    channel = models.CharField(max_length=255)
    transport_key = models.CharField(max_length=255)
    receipt = models.OneToOneField(Receipt, on_delete=models.PROTECT, null=True, blank=True,
                                   related_name="admission_key")
    tombstone = models.OneToOneField(V1AcceptanceTombstone, on_delete=models.PROTECT, null=True, blank=True,
                                     related_name="admission_key")

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "channel", "transport_key"],
                                    name="connector_admissionkey_unique_key",
                                    violation_error_code="admission_key_taken"),
            models.CheckConstraint(condition=(Q(receipt__isnull=False, tombstone__isnull=True)
                                              | Q(receipt__isnull=True, tombstone__isnull=False)),
                                   name="connector_admissionkey_one_target"),
        ]

    def __str__(self) -> str:
        return f"key {self.transport_key!r} on {self.channel}"


class ReceiptComponent(models.Model):
    """One deterministic item extracted from a (possibly batched) Receipt; no worker state. Invariant: immutable;
    one per (receipt, ordinal); its disposition says which Event it produced or why it was quarantined."""

    receipt = models.ForeignKey(Receipt, on_delete=models.PROTECT, related_name="components")
    ordinal = models.PositiveIntegerField()
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    disposition = models.CharField(max_length=32, choices=ComponentDisposition.choices)
    event = models.ForeignKey("connector.Event", on_delete=models.PROTECT, null=True, blank=True,
                              related_name="components")
    reason_code = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["receipt", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["receipt", "ordinal"], name="connector_component_unique_ordinal"),
            models.CheckConstraint(condition=(Q(disposition=ComponentDisposition.QUARANTINED, event__isnull=True)
                                              | (~Q(disposition=ComponentDisposition.QUARANTINED)
                                                 & Q(event__isnull=False))),
                                   name="connector_component_disposition_event"),
        ]
        # The operator screens' receipt list by reason code (issue 38, D-473): the few coded components, newest
        # receipt first, without reading the retained history.
        indexes = [models.Index(fields=["reason_code", "receipt"], name="connector_component_coded",
                                condition=~Q(reason_code=""))]


class Event(models.Model):
    """An immutable normalized external event with typed source-order facts as exact bytes. No lease, retry,
    status or owner fields. Invariants: one live Event per (account, SourceEventKey); one replay generation per
    (account, SourceEventKey, ReplayRequest)."""

    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="events")
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="events")
    receipt = models.ForeignKey(Receipt, on_delete=models.PROTECT, related_name="events")
    route = models.CharField(max_length=255)
    event_kind = models.CharField(max_length=255)
    source_locator = models.CharField(max_length=255)
    occurred_at = models.CharField(max_length=64)
    source_event_key = models.CharField(max_length=255)
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    ordering_contract = models.CharField(max_length=32)
    contract_digest = models.BinaryField(max_length=32)
    partition = models.CharField(max_length=255)
    position_kind = models.CharField(max_length=16, blank=True, default="")
    position = models.DecimalField(max_digits=38, decimal_places=0, null=True, blank=True)
    position_bytes = models.BinaryField(null=True, blank=True)
    tie_breaker = models.BinaryField(null=True, blank=True)
    grouping_key = models.CharField(max_length=255, blank=True, default="")
    replay_request = models.ForeignKey(ReplayRequest, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="events")
    predecessor = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    v1_predecessor = models.ForeignKey(V1PredecessorRef, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["account", "source_event_key"], condition=Q(replay_request__isnull=True),
                                    name="connector_event_one_live_per_key"),
            models.UniqueConstraint(fields=["account", "source_event_key", "replay_request"],
                                    condition=Q(replay_request__isnull=False),
                                    name="connector_event_one_replay_generation"),
            models.CheckConstraint(condition=(Q(replay_request__isnull=True, v1_predecessor__isnull=True)
                                              | Q(replay_request__isnull=False, predecessor__isnull=False,
                                                  v1_predecessor__isnull=True)
                                              | Q(replay_request__isnull=False, predecessor__isnull=True,
                                                  v1_predecessor__isnull=False)),
                                   name="connector_event_replay_has_predecessor"),
        ]

    def __str__(self) -> str:
        return f"event {self.source_event_key}" + (f" (replay)" if self.replay_request_id else "")


class MaterializationDue(models.Model):
    """Work-queue row: written with a Receipt, deleted when its children are materialized. The sweeper scans only
    this small table, never the retained receipt history. Not a fact: deleting it loses nothing but a hold.

    A deterministic materialization failure holds the row (`held_reason` MATERIALIZATION_FAILED, decision
    D-168): the sweeper skips held rows, the operator sees the receipt on the quarantine board with its
    StepFailure evidence, and `materialization_release` puts it back in the queue after the fix. Invariant: a
    held row has both its closed reason and the time it was held."""

    receipt = models.OneToOneField(Receipt, on_delete=models.CASCADE, related_name="materialization_due")
    due_at = models.DateTimeField(auto_now_add=True, db_index=True)
    held_reason = models.CharField(max_length=64, blank=True, default="")
    held_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=(Q(held_reason="", held_at__isnull=True)
                                              | Q(held_reason=StepFailureReason.MATERIALIZATION_FAILED,
                                                  held_at__isnull=False)),
                                   name="connector_materializationdue_hold_whole"),
        ]
