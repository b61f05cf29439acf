"""The cutover subjects that need dual approval, as digests recomputed from the durable facts (registered with
connector.services.approvals when the app is ready).

- `activation_decision` (key: the verified ServingEpoch ID): the epoch's exact ID and digest, its configuration
  generation, and the exhaustive account/gate set it would activate. Any change to one of them is a new digest,
  which voids earlier approvals.
"""
from __future__ import annotations

from connector.canonical.encoding import Record
from connector.canonical.encoding import digest as canonical_digest
from connector.errors import EpochNotFound
from connector.models import AccountServingGate, ServingEpoch

DOMAIN = "nexuscrm.cutover.approval-subject.v1"


def activation_decision(subject_key: str) -> tuple[bytes, str]:
    epoch = ServingEpoch.objects.select_related("configuration").filter(epoch_id=subject_key).first()
    if epoch is None:
        raise EpochNotFound(f"no ServingEpoch {subject_key!r}")
    accounts = list(epoch.configuration.accounts.order_by("account__account_key")
                    .values_list("account__account_key", "account_id"))
    gates = dict(AccountServingGate.objects.filter(account_id__in=[a for _, a in accounts])
                 .values_list("account_id", "pk"))
    value = Record([("kind", "activation_decision"), ("epoch_id", epoch.epoch_id),
                    ("epoch_digest", bytes(epoch.digest)), ("epoch_state", epoch.state),
                    ("configuration", epoch.configuration.generation_id),
                    ("gate_set", [[key, gates.get(account_id, -1)] for key, account_id in accounts])])
    summary = (f"Activate ServingEpoch {epoch.epoch_id} ({epoch.state}, digest {bytes(epoch.digest).hex()[:16]}…) "
               f"for configuration {epoch.configuration.generation_id}: {len(accounts)} accounts, "
               f"{len(gates)} gates")
    return canonical_digest(DOMAIN, value), summary


SUBJECTS = {"activation_decision": activation_decision}
