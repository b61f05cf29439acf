"""How Runtime's application transaction authors outbound work: the route's frozen definition names a push
contract and callout (`"push": {"contract": ..., "callout": ...}`); Runtime calls this through
connector.hooks.author_outbound with the serving guard it already holds. The local record is the effect's owner
slot: a record that already has an active RemoteLink is updated at that remote identity (D-190)."""
from __future__ import annotations

import logging

from django.db import transaction

from effects.models import OutboundCommand
from effects.services.outbound import outbound_command_author


def author_for_runtime(*, ctx, account_key: str, route_definition: dict, command_id: str, record_key: str,
                       fields: dict, suppress_external_effects: bool, execution_id: int | None
                       ) -> OutboundCommand | None:
    push = route_definition.get("push")
    if not push:
        return None
    transaction.on_commit(_wake_dispatch)
    return outbound_command_author(
        ctx=ctx, account_key=account_key, application_scope="runtime.records", effect_root_id=f"{command_id}:{record_key}",
        effect_slot_id=f"push:{push['contract']}", effect_generation_id="g1", push_contract=push["contract"],
        callout=push["callout"], path_params={"record_key": record_key}, body={"record_key": record_key, **fields},
        suppress_external_effects=suppress_external_effects, source_execution_id=execution_id,
        owner_slot=record_key)


def _wake_dispatch() -> None:
    """Wake a dispatch worker after the application transaction commits. Redis only wakes: if the broker is
    down, the sweeper finds the prepared effect in PostgreSQL a few seconds later."""
    try:
        from effects.tasks import effect_dispatch

        effect_dispatch.delay()
    except Exception as exc:  # noqa: BLE001 - a broker outage must never fail the application transaction
        logging.getLogger(__name__).warning("dispatch wake-up not sent; the sweeper will find the effect",
                                            extra={"error": str(exc)})
