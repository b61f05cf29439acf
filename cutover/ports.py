"""The V1 owner port: what the cutover coordinator asks of the V1 deployment and its external owners.

The seed keeps process, snapshot, restore and network-isolation facts with their external owners; L0 only
verifies their receipts (CV2-12-011). The coordinator therefore never imports the V1 implementation: it asks
`v1_owner()` (the class named by settings.CUTOVER_V1_OWNER, `v1.owner.V1Owner` in this product) for receipts and
inventories, stores their canonical digests in its own immutable facts, and re-verifies them.

Every receipt is a frozen value with a canonical `payload` (bytes, canonical_typed_length_delimited_v1 or the
V2 digest profile's encoding) and `digest = sha256(payload)`. A receipt names the exact service cutover attempt
and the exact owner reference it was issued for (CV2-12-028); the coordinator refuses one that does not.

All V1 tables live in the `default` database (decision 2), so calls marked *in the caller's transaction* run
inside the coordinator's `transaction.atomic()` and under the gate locks it already holds (CV2-12-042/092).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string


class BarrierKind(str, Enum):
    """The three owner-level maintenance barriers (CV2-12-022/023/024)."""

    INGRESS = "ingress"  # pollers/streams stop without advancing cursors; push deliveries left unacknowledged
    ROOT_OUTBOUND = "root_outbound"  # new root V1 outbound requests refused retryably; continuation stays open
    AUTHORING = "authoring"  # account creation/removal/enablement and cutover configuration frozen


@dataclass(frozen=True)
class Receipt:
    """A verified owner receipt. `kind` names the receipt family (e.g. "barrier.ingress.closed",
    "generation.terminated", "egress.isolated", "restore.recovered"); `subject` the exact owner reference
    (generation ID, barrier name, ...); `attempt_key` the service cutover attempt."""

    kind: str
    attempt_key: str
    subject: str
    payload: bytes
    digest: bytes


@dataclass(frozen=True)
class V1Release:
    """The exact V1 release tuple: release ID, binary (code) digest, V1 schema digest, configuration tuple digest."""

    release_id: str
    binary_digest: bytes
    schema_digest: bytes
    configuration_digest: bytes


@dataclass(frozen=True)
class V1Generation:
    """One V1 process generation. `state` is `running` or `terminated`; a terminated generation never restarts."""

    generation_id: str
    release_id: str
    state: str
    egress_isolated: bool


@dataclass(frozen=True)
class ManifestEntry:
    call_site: str  # module:function of a provider-I/O call
    effect_table: str  # the authoritative V1 effect row's table
    pre_io_marker: str  # the durable state written before bytes leave ("" = none: unsupported)


@dataclass(frozen=True)
class EgressManifest:
    """The current-tree V1 egress manifest (CV2-12-020/021). `untracked` lists provider-I/O call sites found in
    the tree but absent from the manifest; `supported` is False when any is untracked or lacks a marker."""

    entries: tuple[ManifestEntry, ...]
    untracked: tuple[str, ...]
    digest: bytes

    @property
    def supported(self) -> bool:
        return not self.untracked and all(e.pre_io_marker for e in self.entries)


#: What a V1 position may NOT be: the order rows were enqueued or arrived, or the mere existence of a queue row, is
#: never a source high-water (CV2-06-021).
POSITION_SOURCES_REFUSED = ("enqueue_ordinal", "arrival_order", "queue_row")
POSITION_KINDS = ("integer",)


@dataclass(frozen=True)
class SourceOrderFacts:
    """The typed durable source-order facts the current V1 owner exposes for one route (CV2-06-019): what its
    position is (`position_source`: a durable position the source assigned, never one of POSITION_SOURCES_REFUSED),
    the position's kind, the comparator (name and version), the tie-breaker, how a partition is derived, and
    whether `high_waters` enumerates every partition (`exhaustive_partitions`). `digest` is what a `v1_high_water`
    or `provider_snapshot_barrier` disposition's proof digest must equal."""

    position_source: str
    position_kind: str
    comparator: str
    tie_breaker: str
    partition_key: str
    exhaustive_partitions: bool

    def as_dict(self) -> dict:
        return {"position_source": self.position_source, "position_kind": self.position_kind,
                "comparator": self.comparator, "tie_breaker": self.tie_breaker, "partition_key": self.partition_key,
                "exhaustive_partitions": self.exhaustive_partitions}

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":")).encode()).digest()


@dataclass(frozen=True)
class RouteHaltContract:
    """Per route: does it have a lossless root halt contract, and its ordering-migration disposition
    (`order_independent`, `v1_high_water`, `provider_snapshot_barrier`, `unsupported`) with its proof digest: the
    route's conformance proof digest for `order_independent`, `source_order.digest` for the other two."""

    route_key: str
    lossless_halt: bool
    ordering_disposition: str
    disposition_proof_digest: bytes
    remediation_owner: str
    source_order: SourceOrderFacts | None = None


@dataclass(frozen=True)
class Workload:
    """Measured V1 workload (preflight and remeasurement, CV2-12-016/033)."""

    accepted_backlog: int
    open_partitions: int
    live_leases: int
    ambiguous_effects: int
    nearest_dependency_deadline_s: float | None  # seconds from now to the nearest/latest dependency deadline of
    database_bytes: int                           # the open accepted work (None: no open item has one)
    owner_latency_ms: dict[str, float] = field(default_factory=dict)  # filled by the coordinator (it times them)
    latest_dependency_deadline_s: float | None = None


@dataclass(frozen=True)
class InventoryItem:
    """One V1 row that blocks drain: `kind` in {inbound_nonterminal, window_open, scheduler_work, live_lease,
    cursor_uncheckpointed, handoff_pending, effect_unproven, io_may_have_started}."""

    kind: str
    table: str
    row_id: str
    account_key: str
    detail: str


@dataclass(frozen=True)
class Inventory:
    """The authoritative V1 inventory of the frozen account set: blocking items (empty = drained), the cursors and
    high-waters, and the canonical digest of the whole (terminal-state evidence included)."""

    blocking: tuple[InventoryItem, ...]
    cursors: tuple[tuple[str, str], ...]  # (source key, durable cursor)
    digest: bytes


@dataclass(frozen=True)
class TransportIdentity:
    """One accepted V1 transport identity to export as a ReceiptAdmissionKey tombstone."""

    account_key: str
    source_key: str
    transport_identity: bytes
    payload_digest: bytes
    predecessor_ref: str


@dataclass(frozen=True)
class HighWater:
    """The drained V1 high-water of one order-dependent route and partition (OrderingBaseline source)."""

    account_key: str
    route_key: str
    partition_key: bytes
    high_water: bytes
    comparator: str


class V1OwnerPort(Protocol):
    def release(self) -> V1Release: ...
    def current_generation(self) -> V1Generation | None: ...
    def egress_manifest(self) -> EgressManifest: ...
    def route_contracts(self) -> list[RouteHaltContract]: ...
    def measure(self, account_keys: list[str]) -> Workload: ...

    def close_barrier(self, kind: BarrierKind, attempt_key: str) -> Receipt:
        """Close one owner barrier and wait for in-flight transactions crossing it to return (CV2-12-030)."""

    def reopen_barrier(self, kind: BarrierKind, attempt_key: str) -> Receipt: ...

    def inventory(self, account_keys: list[str]) -> Inventory:
        """In the caller's transaction (the gates are locked by the caller)."""

    def terminate_generation(self, generation_id: str, attempt_key: str) -> Receipt:
        """Terminate every process of the generation; the receipt proves the supervisor disabled it and can never
        restart it (CV2-12-038)."""

    def isolate_egress(self, generation_id: str, attempt_key: str) -> Receipt: ...

    def start_generation(self, release_id: str, attempt_key: str) -> V1Generation:
        """Start a NEW process generation of the exact release (cold abort, restore). Never revives one."""

    def reconcile_effect(self, effect_row_id: str, outcome: str, evidence: bytes, attempt_key: str) -> Receipt:
        """In the caller's transaction: append `remote_finalized` or `no_effect` evidence and terminalize the V1
        effect row (CV2-12-040/042)."""

    def transport_identities(self, account_keys: list[str]) -> list[TransportIdentity]: ...

    def boot_check(self, database_url: str, release: V1Release, attempt_key: str) -> Receipt:
        """Boot the exact V1 release (a separate process) against another database, a restore rehearsal's or a
        restore's copy, and verify it serves that release: V1 schema digest, release tuple, readable cursors,
        high-waters and generations. Raises cutover.errors' refusal on any mismatch (CV2-12-052)."""
    def high_waters(self, account_keys: list[str]) -> list[HighWater]: ...

    def tables(self) -> tuple[str, ...]:
        """Every V1 table, in an order that drops dependents first (CV2-12-078: removed after cutover). Reads no
        row: it still answers after the tables are gone."""


@cache
def v1_owner() -> V1OwnerPort:
    return import_string(settings.CUTOVER_V1_OWNER)()
