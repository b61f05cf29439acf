"""Read paths of the effects app that other apps may use (apps meet only through services and selectors)."""
from __future__ import annotations

from effects.choices import EFFECT_TERMINAL
from effects.models import RemoteEffect


def nonterminal_effects_of_epoch(*, epoch_pk: int, limit: int = 10) -> list[str]:
    """Reasons naming the RemoteEffects of OutboundCommands authored under the epoch that are not terminal
    (`prepared`, `dispatching`, `uncertain`, `remote_confirmed` not yet finalized). An open DispatchPermit always
    belongs to a `dispatching` effect, so it is listed too. Empty when every predecessor effect is terminal
    (CV2-11-011, CV2-11-053)."""
    rows = (RemoteEffect.objects.filter(command__epoch_id=epoch_pk).exclude(state__in=EFFECT_TERMINAL)
            .order_by("pk").values_list("pk", "state")[:limit])
    return [f"effect #{pk} is {state}" for pk, state in rows]
