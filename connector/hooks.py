"""Extension points through which later aggregates block gate transitions without connector importing them.

`effects` registers the open-permit check (halting_v2 -> v2_halted needs an empty open-permit set) and
`cutover` registers the OrderingHandoff check (v2_halted -> v2_serving on the predecessor needs no handoff).
Each blocker returns human-readable reasons; an empty list means clear.
"""
from __future__ import annotations

from collections.abc import Callable

Blocker = Callable[[object], list[str]]
# The channel on which the transaction that closes a permit of a `halting_v2` gate NOTIFYs the gate's pk at its
# commit (effects migration 0016, D-380); `connector.services.halt_wait.wait_halted` LISTENs on it.
HALT_DRAIN_CHANNEL = "connector_halt_drain"
# The set form of a blocker: the reasons of every listed gate in one query, {gate pk: reasons} (gates with no
# reason may be absent). Registered beside its per-gate form; the two must agree gate by gate (a test pins it).
SetBlocker = Callable[[list], dict[int, list[str]]]

_HALT_BLOCKERS: list[Blocker] = []
_HALT_BLOCKER_SETS: dict[Blocker, SetBlocker] = {}
_RESUME_BLOCKERS: list[Blocker] = []


def register_halt_blocker(fn: Blocker, *, of_gates: SetBlocker | None = None) -> Blocker:
    """Register a halt blocker; `of_gates`, its set form, lets a whole-service halt evaluate it for a chunk of
    gates in one query (connector.services.gate_sets, D-281). Without it the set-based halt asks `fn` gate by gate."""
    if fn not in _HALT_BLOCKERS:
        _HALT_BLOCKERS.append(fn)
    if of_gates is not None:
        _HALT_BLOCKER_SETS[fn] = of_gates
    return fn


def register_resume_blocker(fn: Blocker) -> Blocker:
    if fn not in _RESUME_BLOCKERS:
        _RESUME_BLOCKERS.append(fn)
    return fn


def halt_blockers(gate) -> list[str]:
    return [reason for fn in _HALT_BLOCKERS for reason in fn(gate)]


def halt_blockers_of(gates: list) -> dict[int, list[str]]:
    """`halt_blockers` of every gate of `gates`, keyed by gate pk (every gate present, [] when clear), the reasons
    in the same order: each registered blocker's set form once for all of them, or its per-gate form per gate."""
    found: dict[int, list[str]] = {gate.pk: [] for gate in gates}
    for fn in _HALT_BLOCKERS:
        of_gates = _HALT_BLOCKER_SETS.get(fn)
        if of_gates is not None:
            reasons = of_gates(gates) if gates else {}
            for gate in gates:
                found[gate.pk] += reasons.get(gate.pk, [])
        else:
            for gate in gates:
                found[gate.pk] += fn(gate)
    return found


def resume_blockers(gate) -> list[str]:
    return [reason for fn in _RESUME_BLOCKERS for reason in fn(gate)]


# -- outbound authoring ------------------------------------------------------------------------------------------
# Runtime authors OutboundCommands in its application transaction; the `effects` app provides the author. Each
# registered author takes the keyword arguments of every applied change of the transaction (one change is a list
# of one) and authors them all.
_OUTBOUND_AUTHORS: list[Callable[[list[dict]], object]] = []


def register_outbound_author(fn: Callable[[list[dict]], object]) -> Callable[[list[dict]], object]:
    if fn not in _OUTBOUND_AUTHORS:
        _OUTBOUND_AUTHORS.append(fn)
    return fn


def author_outbound(calls: list[dict]) -> list[object]:
    return [fn(calls) for fn in _OUTBOUND_AUTHORS]


# -- replay correlation ------------------------------------------------------------------------------------------
# A replay authors no outbound command (suppress_external_effects), yet it preserves the predecessor's EffectRootID
# for correlation (CV2-09-019): `effects` records, in the replay-admission transaction, the EffectRoots the
# predecessor event authored (D-309).
_REPLAY_ADMITTED: list[Callable[[object], object]] = []


def register_replay_admitted(fn: Callable[[object], object]) -> Callable[[object], object]:
    if fn not in _REPLAY_ADMITTED:
        _REPLAY_ADMITTED.append(fn)
    return fn


def replay_admitted(request) -> None:
    """Called once per new ReplayRequest, inside its admission transaction, after the request row is written."""
    for fn in _REPLAY_ADMITTED:
        fn(request)


# -- revocation evidence ------------------------------------------------------------------------------------------
# A revocation records which permits were already `sending` under the generation (decision 4); effects provides it.
_REVOCATION_EVIDENCE: list[Callable[[object], list[str]]] = []


def register_revocation_evidence(fn: Callable[[object], list[str]]) -> Callable[[object], list[str]]:
    if fn not in _REVOCATION_EVIDENCE:
        _REVOCATION_EVIDENCE.append(fn)
    return fn


def revocation_evidence(credential_gate) -> list[str]:
    return [line for fn in _REVOCATION_EVIDENCE for line in fn(credential_gate)]


# -- publication barriers -------------------------------------------------------------------------------------------
# Every publication write of an owner (Catalog view, pack/binding definitions, L2 configuration, credential
# generation) and every credential revocation asks the cutover app's barrier sets first, inside its own transaction:
# a held ServingPublicationBarrierSet refuses the write (CV2-11/CV2-12-064); an urgent revocation aborts and
# releases a first-activation set only while its CutoverDecision is still rollback_open (CV2-12-065).
_PUBLICATION_GUARDS: list[Callable[[str], None]] = []
_REVOCATION_GUARDS: list[Callable[[object], None]] = []


def register_publication_guard(fn: Callable[[str], None]) -> Callable[[str], None]:
    if fn not in _PUBLICATION_GUARDS:
        _PUBLICATION_GUARDS.append(fn)
    return fn


def register_revocation_guard(fn: Callable[[object], None]) -> Callable[[object], None]:
    if fn not in _REVOCATION_GUARDS:
        _REVOCATION_GUARDS.append(fn)
    return fn


def publication_guard(owner: str) -> None:
    """Raise (refusing the caller's write) while a publication barrier for `owner` is held."""
    for fn in _PUBLICATION_GUARDS:
        fn(owner)


def revocation_guard(credential_gate) -> None:
    for fn in _REVOCATION_GUARDS:
        fn(credential_gate)


# -- coordinated gate actions ----------------------------------------------------------------------------------------
# While a service cutover attempt is open, only its coordinator moves the frozen gates along the V1 path; an
# operator's generic gate action is refused (cutover registers the check). Coordinators pass coordinated=True.
_GATE_ACTION_GUARDS: list[Callable[[object, str], list[str]]] = []


def register_gate_action_guard(fn: Callable[[object, str], list[str]]) -> Callable[[object, str], list[str]]:
    if fn not in _GATE_ACTION_GUARDS:
        _GATE_ACTION_GUARDS.append(fn)
    return fn


def gate_action_blockers(gate, action: str) -> list[str]:
    return [reason for fn in _GATE_ACTION_GUARDS for reason in fn(gate, action)]


# -- admission checks of values sent outbound ------------------------------------------------------------------------
# Admission refuses a value that can never be stored (connector.services.storable); the values a route's Runtime
# sends outbound are stored by `effects`, which registers the check of them here (decision D-165).
_ADMISSION_CHECKS: list[Callable[..., list[str]]] = []


def register_admission_check(fn: Callable[..., list[str]]) -> Callable[..., list[str]]:
    if fn not in _ADMISSION_CHECKS:
        _ADMISSION_CHECKS.append(fn)
    return fn


def admission_problems(*, epoch_pk: int, epoch_digest: bytes, route_definition: dict, record_key: str) -> list[str]:
    """Why the outbound owners could never store what this route would send for `record_key` (empty: fine)."""
    return [problem for fn in _ADMISSION_CHECKS
            for problem in fn(epoch_pk=epoch_pk, epoch_digest=epoch_digest, route_definition=route_definition,
                              record_key=record_key)]


# -- epoch retention ---------------------------------------------------------------------------------------------------
# `draining -> retired` needs every fact that names the epoch terminal (D-267). The connector checks its own facts;
# `effects` registers its nonterminal RemoteEffects (and so open permits), `cutover` its unreleased barrier sets.
# Each blocker returns (stable code, detail naming the rows) pairs; an empty list means clear.
RetentionBlocker = Callable[[object], list[tuple[str, str]]]
_RETENTION_BLOCKERS: list[RetentionBlocker] = []


def register_retention_blocker(fn: RetentionBlocker) -> RetentionBlocker:
    if fn not in _RETENTION_BLOCKERS:
        _RETENTION_BLOCKERS.append(fn)
    return fn


def retention_blockers(epoch) -> list[tuple[str, str]]:
    return [blocker for fn in _RETENTION_BLOCKERS for blocker in fn(epoch)]
