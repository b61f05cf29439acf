"""Several OutboundCommands of one application transaction authored set-based (issue 18 goal 5, D-296).

`outbound_command_author` is the one semantics, and `_prepare` (shared) freezes every byte of each command. What
changes is the number of statements: the slots' active RemoteLinks in one read, the existing commands of the
idempotency keys in one read, the new commands in one insert and their RemoteEffects in one insert, instead of
six statements per command (two reads, a savepoint, two inserts, its release). A concurrent author of the same
key makes the insert fail, which fails the caller's transaction: the batched Runtime then rolls back and every
command takes the per-command path, whose savepoint converges on the winner's row."""
from __future__ import annotations

import hmac

from django.db import IntegrityError, transaction

from connector.errors import roots_closed
from connector.services.guard import lock_serving
from connector.services.materialize import insert_rows
from effects.choices import LinkState
from effects.errors import OutboundConflict, OutboundRefused
from effects.models import OutboundCommand, RemoteEffect, RemoteLink
from effects.services.outbound import _prepare, effect_row


def _links(pairs: set[tuple[int, str]]) -> dict[tuple[int, str], RemoteLink]:
    """The active RemoteLink of each (account, owner slot) pair, in one read."""
    if not pairs:
        return {}
    rows = RemoteLink.objects.filter(account_id__in=sorted({a for a, _ in pairs}),
                                     owner_slot__in=sorted({s for _, s in pairs}), state=LinkState.ACTIVE)
    return {(link.account_id, link.owner_slot): link for link in rows if (link.account_id, link.owner_slot) in pairs}


def outbound_commands_author(*, calls: list[dict]) -> list[int]:
    """`outbound_command_author(**call)` for every call, inside the caller's application transaction, in one
    statement per step for all of them; returns the commands' pks in call order. Each call's guard is checked
    against the rows this transaction holds (`lock_serving` with its exact epoch and fence: answered from the
    transaction's memo). A replay context is refused; a key that exists (or repeats within the calls) returns
    its command if the binding is byte-identical and fails closed (OutboundConflict) otherwise, as the single
    author does. Anything the single author raises is raised here, before any write."""
    assert transaction.get_connection().in_atomic_block, "authored inside the application transaction"
    if any(call["suppress_external_effects"] for call in calls):
        raise OutboundRefused("a replay execution context cannot author outbound commands")
    ctxs = [lock_serving(account_id=c["ctx"].account_id, epoch_id=c["ctx"].epoch_id,
                         epoch_digest=c["ctx"].epoch_digest, expected_fence=c["ctx"].fence) for c in calls]
    links = _links({(ctx.account_id, c["owner_slot"]) for ctx, c in zip(ctxs, calls) if c.get("owner_slot")})
    prepared = []
    for ctx, call in zip(ctxs, calls):
        slot = call.get("owner_slot", "")
        prepared.append(_prepare(
            ctx=ctx, account_key=call["account_key"], application_scope=call["application_scope"],
            effect_root_id=call["effect_root_id"], effect_slot_id=call["effect_slot_id"],
            effect_generation_id=call["effect_generation_id"], push_contract=call["push_contract"],
            callout=call["callout"], path_params=call["path_params"], body=call["body"],
            source_execution_id=call.get("source_execution_id"), predecessor=call.get("predecessor"),
            owner_slot=slot, link=links.get((ctx.account_id, slot)) if slot else None))
    wanted = sorted({(f["account_id"], key) for f, _, key in prepared})
    existing = {(c.account_id, bytes(c.idempotency_key)): (c.pk, None, bytes(c.binding_digest)) for c in
                OutboundCommand.objects.filter(account_id__in=sorted({a for a, _ in wanted}),
                                               idempotency_key__in=[k for _, k in wanted])
                .only("id", "account_id", "idempotency_key", "binding_digest")}
    # Each call resolves to an existing command's pk or to the index of a new row (a key repeated within the
    # calls resolves like an existing one, to the first row): (pk, None, digest) or (None, index, digest).
    rows, order, seen = [], [], {}
    for fields, digest, key in prepared:
        ident = (fields["account_id"], key)
        found = existing.get(ident) or seen.get(ident)
        if found is None:
            row = {k: v for k, v in fields.items() if k not in ("predecessor", "target_link")}
            row["predecessor_id"] = fields["predecessor"].pk if fields["predecessor"] is not None else None
            row["target_link_id"] = fields["target_link"].pk if fields["target_link"] is not None else None
            rows.append({**row, "binding_digest": digest})
            found = seen[ident] = (None, len(rows) - 1, digest)
        elif not hmac.compare_digest(found[2], digest):
            raise OutboundConflict(f"logical effect {fields['effect_root_id']}/{fields['effect_slot_id']}/"
                                   f"{fields['effect_generation_id']} exists with a different frozen binding")
        order.append(found)
    try:
        pks = [pk for (pk,) in insert_rows(OutboundCommand, rows)] if rows else []
    except IntegrityError as exc:
        if (closed := roots_closed(exc)) is not None:  # a succession drain closed the epoch's roots (D-315)
            raise closed from None
        raise
    if rows:
        insert_rows(RemoteEffect, [effect_row(command_id=pk, fields=row) for pk, row in zip(pks, rows)])
    return [pk if pk is not None else pks[index] for pk, index, _ in order]
