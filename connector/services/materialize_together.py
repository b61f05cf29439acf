"""Several due receipts of one account materialized in one transaction (issue 18 goal 5, D-294).

`receipt_materialize` is the one semantics: one guarded transaction per receipt, about 13 statements, whatever its
size. A burst of one-event deliveries pays those round trips per event, and on this machine a round trip after a
pause costs ten times one sent back to back (docs/benchmarks.md, "Why one round trip costs ..."). This module
derives the same rows for the common case, the transport receipts of one account on one immediate route, for up to
`MATERIALIZE_BATCH` receipts with a constant number of statements: the guard once, every receipt `FOR UPDATE` in
ascending pk, their done Components in one read, then the Events, Components, lanes and Projections each in one
statement, exactly as `receipt_materialize` would have derived them receipt after receipt in ascending pk. What it
does not take (a replay receipt, a receipt of another epoch or channel, a windowed route or one with declared
dependencies, tracing on) stays for `receipt_materialize`; any failure rolls the whole transaction back and every
receipt takes that path."""
from __future__ import annotations

from django.db import transaction

from connector import tracing
from connector.choices import ComponentDisposition, ReceiptKind
from connector.faults import fault_point
from connector.models import MaterializationDue, Receipt, ReceiptComponent
from connector.selectors.routes import route_for
from connector.services.guard import lock_serving
from connector.services.materialize import Materialized, _components, _events, _immediate_batch, _Item


def _locked_receipts(receipt_pks: list[int], account_id: int) -> list[Receipt]:
    """The receipts `FOR UPDATE` (their rows only) in ascending pk, with their epochs' compared columns (the
    preimage stays on disk): one statement. Concurrent materializers of any of them serialize, as on the
    single path's `locks.receipt_for_update`."""
    return list(Receipt.objects.select_for_update(of=("self",)).select_related("epoch")
                .only("id", "account_id", "epoch_id", "epoch_digest", "kind", "channel", "payload",
                      "component_count", "replay_request_id", "epoch__id", "epoch__epoch_id", "epoch__digest",
                      "epoch__profile_id", "epoch__state")
                .filter(account_id=account_id, pk__in=sorted(receipt_pks)).order_by("pk"))


def receipts_materialize(*, receipt_pks: list[int], account_id: int) -> tuple[set[int], Materialized]:
    """Materialize the receipts of `receipt_pks` (all of account `account_id`) that this path takes, in one
    guarded transaction. Returns (the receipts it took: each fully materialized and no longer due when this
    returns; the union of what they produced). The others are for `receipt_materialize`. Raises whatever the
    guard or a statement raises; the transaction then rolled back and nothing of any receipt stands.

    Statements for any number of receipts: BEGIN, the guard (gate `v2_serving` and its active epoch, `FOR
    SHARE`), the receipts `FOR UPDATE`, their done Components, the Events (+ one read when a key met an existing
    Event), the Components, the lanes (a read, + an insert for new partitions), the Projections, the due rows
    deleted, COMMIT. Fault point `materialize.after_components` fires once the Components are written."""
    out = Materialized(account_id=account_id)
    if not receipt_pks or tracing.enabled():
        return set(), out  # a traced receipt keeps its own stage span and trace links: the single path
    with transaction.atomic():
        ctx = lock_serving(account_id=account_id)
        receipts = [r for r in _locked_receipts(receipt_pks, account_id)
                    if r.kind == ReceiptKind.TRANSPORT and r.replay_request_id is None
                    and bytes(r.epoch_digest) == ctx.epoch_digest and r.epoch_id == ctx.epoch_pk]
        if not receipts:
            return set(), out
        channel = receipts[0].channel
        route = route_for(epoch_pk=ctx.epoch_pk, epoch_digest=ctx.epoch_digest, account_id=account_id,
                          channel=channel)
        if route.windowed or route.definition.get("depends_on"):
            return set(), out
        receipts = [r for r in receipts if r.channel == channel]
        done: dict[int, set[int]] = {}
        for receipt_pk, ordinal in ReceiptComponent.objects.filter(
                receipt_id__in=[r.pk for r in receipts]).order_by().values_list("receipt_id", "ordinal"):
            done.setdefault(receipt_pk, set()).add(ordinal)
        entries = [(r, _Item(ordinal, n)) for r in receipts
                   if len(done.get(r.pk, ())) != r.component_count
                   for ordinal, n in enumerate(route.parse(bytes(r.payload))) if ordinal not in done.get(r.pk, ())]
        if entries:
            profile_id = receipts[0].epoch.profile_id  # every taken receipt names the guarded epoch
            _events(entries, route, profile_id, None)
            _components(entries)
            out.components += len(entries)
            fault_point("materialize.after_components")
            new = [item for _, item in entries if item.disposition == ComponentDisposition.EVENT]
            out.events.extend(i.event_pk for i in new)
            if new:
                # `_immediate_batch` inserts Projections in (lane pk, ordinal) order; numbered in (receipt pk,
                # ordinal) order, a lane's Projections get their pks in the order one receipt after the other
                # would have given them (pk is the last tie-breaker of a lane's order).
                _immediate_batch([_Item(seq, i.n, i.event_pk, i.disposition) for seq, i in enumerate(new)], route,
                                 ctx, profile_id, False, account_id, out)
        taken = {r.pk for r in receipts}
        MaterializationDue.objects.filter(receipt_id__in=sorted(taken)).delete()
    return taken, out
