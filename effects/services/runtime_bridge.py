"""How Runtime's application transaction authors outbound work: the route's frozen definition names a push
contract and callout (`"push": {"contract": ..., "callout": ...}`); Runtime calls this through
connector.hooks.author_outbound with the serving guard it already holds. The local record is the effect's owner
slot: a record that already has an active RemoteLink is updated at that remote identity (D-190)."""
from __future__ import annotations

import logging
from urllib.parse import quote

from django.db import transaction

from connector import tracing
from connector.errors import ConnectorError
from connector.services.materialize import COMMAND_ID_LENGTH
from effects.models import CommandTrace, OutboundCommand
from effects.services.outbound import frozen_binding, outbound_commands_author
from effects.tasks import effect_dispatch


def _author_call(*, ctx, account_key: str, route_definition: dict, command_id: str, record_key: str, fields: dict,
                 suppress_external_effects: bool, execution_id: int | None) -> dict | None:
    """The outbound author's arguments for one applied change of a pushing route (None: the route pushes
    nothing)."""
    push = route_definition.get("push")
    if not push:
        return None
    return dict(ctx=ctx, account_key=account_key, application_scope="runtime.records",
                effect_root_id=f"{command_id}:{record_key}", effect_slot_id=f"push:{push['contract']}",
                effect_generation_id="g1", push_contract=push["contract"], callout=push["callout"],
                path_params={"record_key": record_key}, body={"record_key": record_key, **fields},
                suppress_external_effects=suppress_external_effects, source_execution_id=execution_id,
                owner_slot=record_key)


@tracing.traced("outbound_command_author")
def author_for_runtime(calls: list[dict]) -> list[int]:
    """The outbound commands of the applied changes of one Runtime application transaction (one change is a
    batch of one), authored by `outbound_commands_author`; returns their pks. One dispatch wake-up after the
    commit, however many."""
    authored = [c for c in (_author_call(**kwargs) for kwargs in calls) if c is not None]
    if not authored:
        return []
    wake_after_commit()
    pks = outbound_commands_author(calls=authored)
    tracing.remember_many(CommandTrace, pks)  # issue 21: the egress request continues each trace after the outbox
    return pks


def wake_after_commit() -> None:
    """One dispatch wake-up per application transaction, however many commands it authors (a batched Runtime
    authors one per applied change, D-293): registered on commit unless this transaction already holds one.
    Django drops the callbacks of a savepoint that rolls back, so a registration that could be lost with a
    sibling's savepoint is never relied on: only one still in the list counts."""
    connection = transaction.get_connection()
    if not any(func is _wake_dispatch for _sids, func, _robust in connection.run_on_commit):
        transaction.on_commit(_wake_dispatch)


def _wake_dispatch() -> None:
    """Wake a dispatch worker after the application transaction commits. Redis only wakes: if the broker is
    down, the sweeper finds the prepared effect in PostgreSQL a few seconds later."""
    try:
        effect_dispatch.delay()
    except Exception as exc:  # noqa: BLE001 - a broker outage must never fail the application transaction
        logging.getLogger(__name__).warning("dispatch wake-up not sent; the sweeper will find the effect",
                                            extra={"error": str(exc)})


# -- what admission must refuse (decision D-165) -------------------------------------------------------------------

def _path_template(epoch_digest: bytes, epoch_pk: int, callout: str) -> str | None:
    """The callout's frozen path template in this exact epoch (`frozen_binding` caches it by epoch identity)."""
    try:
        return frozen_binding(epoch_pk=epoch_pk, epoch_digest=epoch_digest, kind="callout_profile",
                              business_key=callout).definition().get("path_template")
    except ConnectorError:
        return None  # no such callout: authoring refuses it, with its own code


def admission_problems(*, epoch_pk: int, epoch_digest: bytes, route_definition: dict, record_key: str) -> list[str]:
    """Why a push route could never author the outbound command for `record_key`: its EffectRoot ID (command ID,
    ":", record key) must fit `OutboundCommand.effect_root_id`, and the path built from the callout's template
    with the key percent-encoded (every byte outside RFC 3986 "unreserved", the longest encoding any encoder
    produces) must fit `OutboundCommand.path`. Registered as a connector admission check."""
    push = route_definition.get("push")
    if not push or not record_key:
        return []
    problems = []
    root_limit = OutboundCommand._meta.get_field("effect_root_id").max_length - COMMAND_ID_LENGTH - 1
    if len(record_key) > root_limit:
        problems.append(f"record_key has {len(record_key)} characters; as the outbound EffectRoot ID "
                        f"(OutboundCommand.effect_root_id) at most {root_limit} fit")
    template = _path_template(bytes(epoch_digest), epoch_pk, push["callout"])
    path_limit = OutboundCommand._meta.get_field("path").max_length
    try:
        path = template.format(record_key=quote(record_key, safe="")) if template else ""
    except (KeyError, IndexError, ValueError):
        path = ""  # a template this route cannot fill: authoring refuses it, with its own code
    if len(path) > path_limit:
        problems.append(f"record_key percent-encoded makes a {len(path)}-character outbound path; "
                        f"OutboundCommand.path holds at most {path_limit}")
    return problems
