"""The connector's row-locking reads, as the public entry point other apps use (D-258, ARCHITECTURE.md "Imports").

Other apps never import `connector.locks` (an import-linter contract holds it); they take connector rows in the
canonical order (docs/locking.md: 1 publication barrier set, 2 ServingEpoch(s), 3 AccountServingGate, 4
CredentialGenerationDispatchGate, 5 OrderingLane, 6 entity rows) through these names. Each is the connector's
own helper, re-exported unchanged: the lock mode, the ordering and the fair advisory lock stay where they are.
`share_one` is the single-row `FOR SHARE` read other apps' lock modules build their own share locks on.
"""
from __future__ import annotations

from connector.locks import _share_one as share_one
from connector.locks import (
    credential_gate_for_share,
    credential_gate_for_update,
    epoch_for_share,
    epoch_for_update,
    epochs_for_update,
    gate_for_update,
    gates_for_update,
    lane_for_update,
)

__all__ = ["credential_gate_for_share", "credential_gate_for_update", "epoch_for_share", "epoch_for_update",
           "epochs_for_update", "gate_for_update", "gates_for_update", "lane_for_update", "share_one"]
