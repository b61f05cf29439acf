"""Read paths of epochs and gates. An epoch is addressed by exact ID and digest (CV2-02-025)."""
from __future__ import annotations

import hmac

from django.db.models import QuerySet

from connector.choices import EpochState
from connector.errors import EpochNotFound
from connector.models import AccountServingGate, CredentialGenerationDispatchGate, ServingEpoch


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
