"""RemoteCallIntent (an operator-authorized intentional new remote call for an existing EffectRoot and slot) and
ReplayEffectCorrelation (a replay's evidence of the EffectRoots its predecessor authored). Seed "Replay and
external effects" (CV2-09-019..024, D-305..D-309)."""
from __future__ import annotations

from django.db import models
from django.db.models import Q

__all__ = ["RemoteCallIntent", "ReplayEffectCorrelation"]


class RemoteCallIntent(models.Model):
    """Append-only: an operator's authorized business intent to call the remote again for an EffectRoot and slot
    that already has RemoteEffects, and the disposition its admission reached after reconciling every predecessor
    effect of that root and slot under their row locks (`effects.services.intents.remote_call_authorize`).

    `resumed`: a predecessor effect is `prepared` or `dispatching`; it continues on the normal path and no new
    effect exists. `successor`: every predecessor is proven terminal `no_effect`; a successor OutboundCommand (a
    new EffectGenerationID, explicit predecessor linkage, a newly frozen dispatch binding) was authored. A rejected
    or blocked intent writes nothing. Invariants: one per (account, intent ID); a successor command belongs to at
    most one intent; the disposition names exactly its rows; never updated."""

    account = models.ForeignKey("connector.ConnectorAccount", on_delete=models.PROTECT,
                                related_name="remote_call_intents")
    intent_id = models.CharField(max_length=128)
    application_scope = models.CharField(max_length=255)
    effect_root_id = models.CharField(max_length=255)
    effect_slot_id = models.CharField(max_length=255)
    principal = models.CharField(max_length=255)
    reason = models.TextField()
    request_digest = models.BinaryField(max_length=32)
    epoch = models.ForeignKey("connector.ServingEpoch", on_delete=models.PROTECT, related_name="+")
    gate_fence = models.BigIntegerField()
    disposition = models.CharField(max_length=16, choices=[("resumed", "resumed"), ("successor", "successor")])
    # Every predecessor effect the admission locked and read: [{"effect": pk, "generation": id, "state": state}].
    reconciled = models.JSONField(default=list)
    resumed_effect = models.ForeignKey("effects.RemoteEffect", on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="resumed_by_intents")
    predecessor_effect = models.ForeignKey("effects.RemoteEffect", on_delete=models.PROTECT, null=True, blank=True,
                                           related_name="successor_intents")
    successor_command = models.OneToOneField("effects.OutboundCommand", on_delete=models.PROTECT, null=True,
                                             blank=True, related_name="authorizing_intent")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        permissions = [("authorize_remote_call", "Can authorize an intentional new remote call for an effect root")]
        constraints = [
            models.UniqueConstraint(fields=["account", "intent_id"], name="effects_intent_one_per_id"),
            models.CheckConstraint(condition=Q(disposition__in=["resumed", "successor"]),
                                   name="effects_intent_disposition"),
            models.CheckConstraint(
                condition=Q(disposition="resumed", resumed_effect__isnull=False, predecessor_effect__isnull=True,
                            successor_command__isnull=True)
                | Q(disposition="successor", resumed_effect__isnull=True, predecessor_effect__isnull=False,
                    successor_command__isnull=False),
                name="effects_intent_disposition_rows"),
            models.CheckConstraint(condition=~Q(reason="") & ~Q(principal="") & ~Q(intent_id=""),
                                   name="effects_intent_attributed"),
        ]

    def __str__(self) -> str:
        return f"intent {self.intent_id} ({self.disposition}) for {self.effect_root_id}/{self.effect_slot_id}"


class ReplayEffectCorrelation(models.Model):
    """Append-only evidence, written in the replay-admission transaction: the replay (whose execution runs with
    `suppress_external_effects` and authors no OutboundCommand) correlates with an EffectRoot its predecessor event
    authored, directly or through an earlier replay of it. It preserves the EffectRootID for correlation and mints
    nothing: no command, no effect, no EffectGenerationID. Invariants: one per (replay request, predecessor
    command); the root, slot and generation repeat the predecessor command's; never updated."""

    replay_request = models.ForeignKey("connector.ReplayRequest", on_delete=models.PROTECT,
                                       related_name="effect_correlations")
    predecessor_command = models.ForeignKey("effects.OutboundCommand", on_delete=models.PROTECT,
                                            related_name="replay_correlations")
    application_scope = models.CharField(max_length=255)
    effect_root_id = models.CharField(max_length=255)
    effect_slot_id = models.CharField(max_length=255)
    predecessor_generation_id = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["replay_request", "predecessor_command"],
                                               name="effects_replaycorrelation_once")]

    def __str__(self) -> str:
        return f"replay #{self.replay_request_id} ~ {self.effect_root_id}"
