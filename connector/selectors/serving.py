"""Read paths of epochs and gates. An epoch is addressed by exact ID and digest (CV2-02-025)."""
from __future__ import annotations

import hmac

from django.db.models import QuerySet

from connector import hooks
from connector.choices import EXECUTION_ACTIVE, EpochState, WindowState
from connector.errors import EpochNotFound
from connector.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    Execution,
    MaterializationDue,
    OrderingLane,
    Projection,
    ProjectionWindow,
    ServingEpoch,
)

# The stable codes of an unmet retention rule (D-267, docs/errors.md). Each names one kind of open fact that still
# references the epoch; the detail lists up to RETENTION_SHOWN of its rows.
RETENTION_CODES = ("GATE_NAMES_EPOCH", "RECEIPT_UNMATERIALIZED", "EXECUTION_OPEN", "LANE_WORK_OPEN", "WINDOW_OPEN",
                   "EFFECT_OPEN", "BARRIER_SET_OPEN")
RETENTION_SHOWN = 10


def epoch_get(*, epoch_id: str, digest: bytes) -> ServingEpoch:
    epoch = ServingEpoch.objects.filter(epoch_id=epoch_id).first()
    if epoch is None or not hmac.compare_digest(bytes(epoch.digest), bytes(digest)):
        raise EpochNotFound(f"no ServingEpoch {epoch_id} with that digest")
    return epoch


def epoch_list(*, state: str | None = None) -> QuerySet[ServingEpoch]:
    qs = ServingEpoch.objects.select_related("configuration", "catalog_view")
    return qs.filter(state=state) if state else qs


def prepared_epoch_pks() -> list[int]:
    return list(ServingEpoch.objects.filter(state=EpochState.PREPARED).order_by("pk").values_list("pk", flat=True))


def gate_list() -> QuerySet[AccountServingGate]:
    return AccountServingGate.objects.select_related("account", "epoch").defer("epoch__preimage")


def gate_get(*, account_id: int) -> AccountServingGate:
    return AccountServingGate.objects.select_related("account", "epoch").defer("epoch__preimage").get(
        account_id=account_id)


def credential_gate_get(*, generation_id: str) -> CredentialGenerationDispatchGate:
    return CredentialGenerationDispatchGate.objects.select_related("credential_generation").get(
        credential_generation__generation_id=generation_id)


def unmaterialized_receipts_of_epoch(*, epoch_pk: int, limit: int = RETENTION_SHOWN) -> list[int]:
    """The receipts admitted under the epoch (replay receipts included) that still await materialization, in pk
    order. Only an `active` epoch on a `v2_serving` gate materializes them (the guard), so the succession refuses
    its cutoff while any exists (D-268) and retirement refuses with RECEIPT_UNMATERIALIZED (D-267)."""
    return list(MaterializationDue.objects.filter(receipt__epoch_id=epoch_pk).order_by("receipt_id")
                .values_list("receipt_id", flat=True)[:limit])


def _rows(label: str, pks: list[int]) -> str:
    return ", ".join(f"{label} #{pk}" for pk in pks)


def epoch_retention_blockers(epoch: ServingEpoch) -> list[tuple[str, str]]:
    """Why `epoch` may not retire yet (D-267): (stable code, detail naming the rows) for every kind of fact that
    names it and is not terminal; empty when its immutable facts satisfy retention (CV2-11-026). Reads only; the
    retirement calls it under the epoch's FOR UPDATE lock. A gate naming the epoch, a Receipt still awaiting
    materialization (a replay's receipt included: it carries the target epoch), an Execution `ready` or
    `waiting_dependency` (leased or not), a lane with an active Execution or a pending Projection, an open
    window; then the registered blockers of the other apps (effects: nonterminal RemoteEffects, so open permits;
    cutover: unreleased barrier sets). Time is no input: nothing here ages out."""
    n = RETENTION_SHOWN
    found: list[tuple[str, str]] = []
    gates = list(AccountServingGate.objects.filter(epoch=epoch).order_by("account_id")
                 .values_list("account_id", "mode")[:n])
    if gates:
        found.append(("GATE_NAMES_EPOCH", ", ".join(f"gate of account {a} ({m})" for a, m in gates)))
    receipts = unmaterialized_receipts_of_epoch(epoch_pk=epoch.pk, limit=n)
    if receipts:
        found.append(("RECEIPT_UNMATERIALIZED", _rows("receipt", receipts) + " awaiting materialization"))
    executions = list(Execution.objects.filter(epoch=epoch, state__in=EXECUTION_ACTIVE).order_by("pk")
                      .values_list("pk", "state", "lease_holder")[:n])
    if executions:
        found.append(("EXECUTION_OPEN", ", ".join(
            f"execution #{pk} is {state}" + (f" (leased by {holder})" if holder else "")
            for pk, state, holder in executions)))
    lanes = sorted({*OrderingLane.objects.filter(epoch=epoch, active_execution__isnull=False)
                    .values_list("pk", flat=True)[:n],
                    *Projection.objects.filter(epoch=epoch, lane_status="pending")
                    .values_list("lane_id", flat=True).distinct()[:n]})[:n]
    if lanes:
        found.append(("LANE_WORK_OPEN", _rows("lane", lanes) + " with an active execution or a pending projection"))
    windows = list(ProjectionWindow.objects.filter(epoch=epoch, state=WindowState.OPEN).order_by("pk")
                   .values_list("pk", flat=True)[:n])
    if windows:
        found.append(("WINDOW_OPEN", _rows("window", windows) + " still open"))
    return found + hooks.retention_blockers(epoch)


def provider_io_held_epochs() -> QuerySet:
    """The epochs whose service-cutover first activation committed but is not read back yet (`provider_io_held`,
    CV2-12-071, D-321). While one exists no provider I/O of the service starts: a DispatchPermit is refused by its
    guard, and a REST bulk delivery submit or pre-I/O marker reads this (as an EXISTS of the row it already locks,
    effects.services.delivery.journal). Once cleared a flag is never set again (connector migration 0023), so a
    reader that sees none needs no lock on the epochs."""
    return ServingEpoch.objects.filter(provider_io_held=True)
