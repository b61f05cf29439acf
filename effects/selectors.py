"""Read paths of the effects app that other apps may use (apps meet only through services and selectors)."""
from __future__ import annotations

from django.db import connection

from connector.selectors.poison import held_receipts, lanes_step_failed
from effects.choices import EFFECT_TERMINAL, PermitState
from effects.models import (
    DeliveryOperation,
    DispatchPermit,
    MutationGate,
    OutboundCommand,
    ReceiverCertification,
    RemoteEffect,
    RemoteLink,
    ReplayEffectCorrelation,
)
from effects.models.delivery.operations import RECONCILIATION_WAITING

# The effects model classes (and the one queryset filter) other apps may name, as types and as the subject of
# their own read queries (D-259). `effects.models` is private to this app (an import-linter contract holds it);
# every write is an effects service, every row lock `effects.locks` behind one. Growing this list is reviewed.
__all__ = ["DeliveryOperation", "DispatchPermit", "MutationGate", "OutboundCommand", "RECONCILIATION_WAITING",
           "RELEASABLE_KINDS", "ReceiverCertification", "RemoteEffect", "RemoteLink", "destination_limiter_overview",
           "effect_retention_blockers", "effect_list", "effect_links", "effect_root_chain", "effects_of_execution",
           "link_get",
           "nonterminal_effects_of_epoch", "open_effects_of_epoch", "open_permit_reasons_of", "poison_held",
           "replay_effect_roots"]


def open_effects_of_epoch(*, epoch_pk: int):
    """The RemoteEffects of OutboundCommands authored under the epoch that are not terminal, as a queryset of their
    pks (the succession drain counts them in one statement with the epoch's other continuation work, D-316)."""
    return (RemoteEffect.objects.filter(command__epoch_id=epoch_pk).exclude(state__in=EFFECT_TERMINAL)
            .values_list("pk", flat=True))


def nonterminal_effects_of_epoch(*, epoch_pk: int, limit: int = 10) -> list[str]:
    """Reasons naming the RemoteEffects of OutboundCommands authored under the epoch that are not terminal
    (`prepared`, `dispatching`, `uncertain`, `remote_confirmed` not yet finalized). An open DispatchPermit always
    belongs to a `dispatching` effect, so it is listed too. Empty when every predecessor effect is terminal
    (CV2-11-011, CV2-11-053)."""
    rows = (RemoteEffect.objects.filter(command__epoch_id=epoch_pk).exclude(state__in=EFFECT_TERMINAL)
            .order_by("pk").values_list("pk", "state")[:limit])
    return [f"effect #{pk} is {state}" for pk, state in rows]


def effect_retention_blockers(epoch) -> list[tuple[str, str]]:
    """A draining epoch retires only once every RemoteEffect authored under it is terminal (D-267): registered as
    a connector retention blocker; code EFFECT_OPEN names the effects (an open permit's effect is `dispatching`)."""
    open_effects = nonterminal_effects_of_epoch(epoch_pk=epoch.pk)
    return [("EFFECT_OPEN", ", ".join(open_effects))] if open_effects else []


RATE_WINDOW_SECONDS = 10


def destination_limiter_overview(limiter) -> dict:
    """What the operator sees of one destination: its declared limit (the newest command's frozen one), the
    permits granted in the last RATE_WINDOW_SECONDS (as a rate per second, through effects_permit_limiter_rate),
    permits in flight, and its receiver deferrals. Reads only; takes no lock."""
    from datetime import timedelta

    from django.utils import timezone

    limit = (OutboundCommand.objects.filter(limiter_id=limiter.pk).order_by("-pk")
             .values_list("rate_requests_per_second", "rate_max_in_flight", "rate_burst").first())
    since = timezone.now() - timedelta(seconds=RATE_WINDOW_SECONDS)
    permits = DispatchPermit.objects.filter(limiter_id=limiter.pk)
    recent = permits.filter(granted_at__gte=since).count()
    return {"limit": (f"{limit[0]}/s, {limit[1]} in flight, burst {limit[2]}" if limit else "none"),
            "rate": f"{recent / RATE_WINDOW_SECONDS:.1f}/s over {RATE_WINDOW_SECONDS} s",
            "in_flight": permits.filter(state__in=("granted", "sending")).count(),
            "deferrals": limiter.deferrals_total}


# `dispatch.open_permit_reasons` for several gates in one statement: each gate's first 20 open permits, pk order.
_OPEN_PERMITS_OF_GATES_SQL = """
SELECT gate_id, id, state FROM (
    SELECT p.gate_id, p.id, p.state, row_number() OVER (PARTITION BY p.gate_id ORDER BY p.id) AS n
      FROM effects_dispatchpermit p
     WHERE p.gate_id = ANY(%(gates)s::bigint[]) AND p.state = ANY(%(states)s::text[])
) AS open_permits WHERE n <= 20 ORDER BY gate_id, id"""


def open_permit_reasons_of(gates: list) -> dict[int, list[str]]:
    """`dispatch.open_permit_reasons` of every gate of `gates` in one query, {gate pk: reasons} (clear gates
    absent): the set form of the halt blocker, for the whole-service halt (D-281)."""
    assert DispatchPermit._meta.db_table == "effects_dispatchpermit"
    found: dict[int, list[str]] = {}
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_PERMITS_OF_GATES_SQL, {"gates": sorted({g.pk for g in gates}),
                                                    "states": [PermitState.GRANTED, PermitState.SENDING]})
        for gate_pk, pk, state in cursor.fetchall():
            found.setdefault(gate_pk, []).append(f"open dispatch permit #{pk} ({state})")
    return found


def effect_root_chain(*, account_key: str, effect_root_id: str) -> list[tuple]:
    """Every effect of an EffectRoot (all slots), oldest first: (slot, generation, command pk, effect pk, state,
    predecessor command pk, authorizing intent ID or ""), for the operator deciding an intentional new remote call
    (D-305)."""
    rows = (OutboundCommand.objects.filter(account__account_key=account_key, effect_root_id=effect_root_id)
            .order_by("effect_slot_id", "pk")
            .values_list("effect_slot_id", "effect_generation_id", "pk", "effect__pk", "effect__state",
                         "predecessor_id", "authorizing_intent__intent_id"))
    return [(*row[:6], row[6] or "") for row in rows]


def replay_effect_roots(*, replay_request_pk: int) -> list[tuple[str, str, str]]:
    """The (EffectRootID, EffectSlotID, predecessor EffectGenerationID) a replay correlates with: the roots its
    predecessor event authored, recorded at its admission; the replay itself minted none (CV2-09-019, D-309)."""
    return list(ReplayEffectCorrelation.objects.filter(replay_request_id=replay_request_pk).order_by("pk")
                .values_list("effect_root_id", "effect_slot_id", "predecessor_generation_id"))


# -- the operator screens' lists and chains (issue 38 item 2, D-470) ------------------------------------------------

def effect_list(*, account: int | None, state: str, reason: str, cutoff, before: int | None, size: int) -> list:
    """RemoteEffects newest first (keyset on pk: below `before`), by account, state, quarantine reason and age
    (last change at or before `cutoff`), with their commands; at most `size` rows."""
    rows = RemoteEffect.objects.select_related("command", "account").defer(
        "logical_effect_digest", "command__request_body", "command__idempotency_key", "command__epoch_digest",
        "command__pack_payload_digest", "command__route_policy_digest", "command__request_digest",
        "command__predecessor_digest", "command__binding_digest")
    if account is not None:
        rows = rows.filter(account_id=account)
    if state:
        rows = rows.filter(state=state)
    if reason:
        rows = rows.filter(quarantine_reason=reason)
    if cutoff is not None:
        rows = rows.filter(changed_at__lte=cutoff)
    if before is not None:
        rows = rows.filter(pk__lt=before)
    return list(rows.order_by("-pk")[:size])


def effects_of_execution(*, execution_pk: int, limit: int = 50) -> list:
    """The OutboundCommands an execution authored, each with its RemoteEffect (the chain's downstream half)."""
    return list(OutboundCommand.objects.filter(source_execution_id=execution_pk).select_related("effect")
                .only("pk", "effect_root_id", "effect_slot_id", "effect_generation_id", "method", "path",
                      "effect__id", "effect__state", "effect__quarantine_reason").order_by("pk")[:limit])


def effect_links(*, effect_pk: int) -> list:
    """The RemoteLinks an effect created (active or retired), oldest first."""
    return list(RemoteLink.objects.filter(effect_id=effect_pk).order_by("pk"))


def link_get(*, link_pk: int) -> tuple:
    """A RemoteLink, with the effects whose commands addressed it (updates sent to its remote identity)."""
    link = RemoteLink.objects.select_related("effect", "account").get(pk=link_pk)
    addressed = list(RemoteEffect.objects.filter(command__target_link_id=link_pk).select_related("command")
                     .only("pk", "state", "command__effect_root_id", "command__effect_slot_id",
                           "command__effect_generation_id", "command__method", "command__path").order_by("pk")[:50])
    return link, addressed


# -- poison holds an operator releases after the fix (D-168), in bulk too (D-490) ----------------------------------

RELEASABLE_KINDS = {"MATERIALIZATION_FAILED": "receipt", "LANE_STEP_FAILED": "lane", "EFFECT_STEP_FAILED": "effect",
                    "DELIVERY_STEP_FAILED": "delivery"}


def poison_held(*, code: str, account_key: str | None = None) -> list[int]:
    """The pks of the items held with `code` that a release lifts (RELEASABLE_KINDS), of one account when
    `account_key` is given (a delivery operation belongs to no account: the filter keeps none of them). Reads only;
    each release re-checks its item's hold under the item's lock. Raises KeyError for another code."""
    kind = RELEASABLE_KINDS[code]
    if kind == "receipt":
        return held_receipts(account_key=account_key)
    if kind == "lane":
        return lanes_step_failed(account_key=account_key)
    if kind == "effect":
        rows = RemoteEffect.objects.filter(quarantine_reason=code).exclude(state="quarantined")
        if account_key is not None:
            rows = rows.filter(account__account_key=account_key)
        return list(rows.order_by("pk").values_list("pk", flat=True))
    if account_key is not None:
        return []
    return list(DeliveryOperation.objects.filter(held_reason=code).order_by("held_at", "pk")
                .values_list("pk", flat=True))
