"""The connector's row-locking reads, as the public entry point other apps use (D-258, docs/spec/ARCHITECTURE.md "Layout").

Other apps never import `connector.locks` (an import-linter contract holds it); they take connector rows in the
canonical order (docs/locking.md: 1 publication barrier set, 2 ServingEpoch(s), 3 AccountServingGate, 4
CredentialGenerationDispatchGate, 5 OrderingLane, 6 entity rows) through these names. Each is the connector's
own helper, re-exported unchanged: the lock mode, the ordering and the fair advisory lock stay where they are.
`owner_barriers_lock` takes the owner publication barriers (advisory, before every row lock; D-284). `share_one`
is the single-row `FOR SHARE` read other apps' lock modules build their own share locks on.

Each name is looked up in `connector.locks` when it is used (PEP 562 module `__getattr__`), not copied at import
time: there is one binding of each helper, so an instrumented `connector.locks.<name>` (the crash and race tests,
`bench activation`'s phase timers) is what every app calls.
"""
from __future__ import annotations

from connector import locks as _locks

__all__ = ["credential_gate_for_share", "credential_gates_for_share", "credential_gate_for_update", "epoch_for_share", "epoch_for_update",
           "epochs_for_update", "gate_for_update", "gates_for_update", "lane_for_update", "owner_barriers_lock",
           "share_one"]
_SOURCES = {"share_one": "_share_one"}


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (its public names: {', '.join(__all__)})")
    return getattr(_locks, _SOURCES.get(name, name))


def __dir__() -> list[str]:
    return sorted(__all__)
