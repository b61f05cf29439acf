"""The closed inventory of V2 paths and the authority selected for each (issue 22; CV2-12-010, D-320).

Two parts:

- `PATHS`, the code-level registry: every path kind the seed's delivery gate 3 names (route, partition, account,
  gate, ingress, replay, materialization, claim, execution, outbound, dispatch), each with the one authority
  function it takes and the production write services that take it. It is closed against the code: a test scans
  every service module of connector and effects for the functions that call the serving guard and requires that
  set to equal the services registered here (tests/connector/test_path_inventory.py), so a new guarded write
  service that is not registered, or a registered one that no longer exists or no longer takes the guard, fails.
  `BINDING_PATHS` maps every Catalog binding kind to the path kinds a binding of it opens (closed over
  BindingKind by the same test).
- `activation_inventory`, computed from the database for one activation: every account of the configuration
  (authority: its one serving gate), every gate (must be `v2_validating`, to be bound to the candidate epoch),
  every enabled route of every account (authority: the candidate epoch's frozen binding proof, and a registered
  authority for each path kind its binding kind opens), every credential generation the configuration maps
  (authority: its CredentialGenerationDispatchGate), and the partitions the caller names (authority: the
  candidate epoch's OrderingLane). Anything without its authority is listed as uncovered; the cutover refuses to
  hold or commit the activation while anything is (cutover.services.activation_inventory).

Strings name the services (connector imports neither effects nor cutover: import-linter); the test resolves them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from connector.choices import BindingKind, GateMode
from connector.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    OrderingLane,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServingEpochBindingProof,
)

__all__ = ["PATHS", "PATH_KINDS", "BINDING_PATHS", "GUARD", "PathKind", "Inventory", "activation_inventory",
           "activation_inventory_lost", "guarded_services", "registry_value"]

GUARD = "connector.services.guard.lock_serving"


class PathKind(NamedTuple):
    kind: str
    authority: str  # the dotted name of the function every write of this path takes
    services: tuple[str, ...]  # the production write services of the path that call the serving guard


PATHS: tuple[PathKind, ...] = (
    PathKind("route", "connector.selectors.routes.route_for", ()),
    PathKind("partition", GUARD, ("connector.services.advance.lanes_advance",
                                  "connector.services.advance.lane_gap_deadline",
                                  "connector.services.advance.window_seal_due",
                                  "connector.services.lanes.lane_resume")),
    PathKind("account", GUARD, ()),
    PathKind("gate", "connector.services.gates.gate_transition", ()),
    PathKind("ingress", GUARD, ("connector.services.admission._admit_hinted",
                                "connector.services.admission._admit_ordered")),
    PathKind("replay", GUARD, ("connector.services.replay.replay_request_admit",)),
    PathKind("materialization", GUARD, ("connector.services.materialize.receipts_materialize",)),
    PathKind("claim", GUARD, ("connector.services.claims.execution_claim",
                              "connector.services.claims._lease")),
    PathKind("execution", GUARD, ("connector.services.dependencies.dependency_resolve",
                                  "connector.services.execution.execution_record_result",
                                  "connector.services.execution._record_batch",
                                  "connector.services.runtime.runtime_command_apply",
                                  "connector.services.runtime._guard_pushing")),
    PathKind("outbound", GUARD, ("effects.services.outbound.outbound_commands_author",
                                 "effects.services.intents.remote_call_authorize")),
    PathKind("dispatch", GUARD, ("effects.services.dispatch._claim_one",
                                 "effects.services.dispatch.permit_acquire",
                                 "effects.services.dispatch_batch.effects_claim_batch",
                                 "effects.services.recovery.uncertain_recover")),
)
PATH_KINDS = tuple(p.kind for p in PATHS)

#: The path kinds a Catalog binding of each kind opens (every one must have a registered authority).
BINDING_PATHS: dict[str, tuple[str, ...]] = {
    BindingKind.INBOUND_ROUTE: ("route", "partition", "ingress", "replay", "materialization", "claim", "execution"),
    BindingKind.FIELD_MAPPING: ("materialization",),
    BindingKind.PUSH_CONTRACT: ("outbound", "dispatch"),
    BindingKind.CALLOUT_PROFILE: ("dispatch",),
}


def guarded_services() -> set[str]:
    return {s for p in PATHS for s in p.services}


def registry_value() -> list:
    """The registry as canonical-encoder values (frozen into the activation evidence with its digest)."""
    return [[p.kind, p.authority, list(p.services)] for p in PATHS] + [
        [f"binding:{kind}", ",".join(BINDING_PATHS.get(kind, ())), []] for kind in BindingKind.values]


@dataclass
class Inventory:
    """Every (kind, subject, authority) covered, and every (kind, subject, reason) not; ordered and stable."""

    entries: list[list[str]] = field(default_factory=list)
    uncovered: list[list[str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, _, _ in self.entries:
            out[kind] = out.get(kind, 0) + 1
        return out


def _authorities() -> dict[str, str]:
    return {p.kind: p.authority for p in PATHS if p.authority}


def activation_inventory(*, epoch_pk: int, configuration_pk: int,
                         partitions: list[tuple[int, str, str]] = ()) -> Inventory:
    """The per-activation inventory of one candidate epoch and configuration (see the module docstring).
    `partitions`: (account id, route, partition) of every source-order partition the caller certified (the
    cutover's OrderingBaselines). A handful of set-based reads, whatever the account count."""
    inv = Inventory()
    authorities = _authorities()
    accounts = list(ServiceConfigurationAccount.objects.filter(generation_id=configuration_pk)
                    .order_by("account_id").values_list("account_id", "enabled_routes"))
    gates = dict((a, (pk, mode)) for pk, a, mode in AccountServingGate.objects.filter(
        account_id__in=[a for a, _ in accounts]).values_list("pk", "account_id", "mode"))
    bindings = {(kind, key): ordinal for kind, key, ordinal in ServingEpochBindingProof.objects.filter(
        epoch_id=epoch_pk).values_list("binding__kind", "binding__business_key", "ordinal")}
    for kind, key in sorted(bindings):
        missing = [k for k in BINDING_PATHS.get(kind, ("?",)) if k not in authorities]
        if missing or kind not in BINDING_PATHS:
            inv.uncovered.append([f"binding:{kind}", key, "path kind without a selected authority: "
                                  + ",".join(missing or [f"binding kind {kind} is not registered"])])
    for account_id, enabled in accounts:
        gate = gates.get(account_id)
        if gate is None:
            inv.uncovered.append(["account", str(account_id), "no serving gate"])
            continue
        inv.entries.append(["account", str(account_id), f"{authorities['account']}:gate#{gate[0]}"])
        if gate[1] != GateMode.V2_VALIDATING:
            inv.uncovered.append(["gate", str(gate[0]), f"gate is {gate[1]}, not v2_validating"])
        else:
            inv.entries.append(["gate", str(gate[0]), authorities["gate"]])
        for route in sorted(enabled or ()):
            ordinal = bindings.get((BindingKind.INBOUND_ROUTE.value, route))
            if ordinal is None:
                inv.uncovered.append(["route", f"{account_id}:{route}", "no frozen binding in the candidate epoch"])
            elif any(k not in authorities for k in BINDING_PATHS.get(BindingKind.INBOUND_ROUTE, ("?",))):
                inv.uncovered.append(["route", f"{account_id}:{route}", "its path kinds have no selected authority"])
            else:
                inv.entries.append(["route", f"{account_id}:{route}", f"{authorities['route']}:binding#{ordinal}"])
    credential_gates = dict(CredentialGenerationDispatchGate.objects.filter(
        credential_generation__configuration_mappings__generation_id=configuration_pk).values_list(
        "credential_generation_id", "pk"))
    for account_id, ref, generation in ServiceConfigurationCredentialMapping.objects.filter(
            generation_id=configuration_pk).order_by("account_id", "credential_ref").values_list(
            "account_id", "credential_ref", "credential_generation_id"):
        gate_pk = credential_gates.get(generation)
        subject = f"{account_id}:{ref}"
        if gate_pk is None:
            inv.uncovered.append(["dispatch", subject, "credential generation without a dispatch gate"])
        else:
            inv.entries.append(["dispatch", subject, f"{authorities['dispatch']}:credential_gate#{gate_pk}"])
    lanes = {(a, r, p): pk for pk, a, r, p in OrderingLane.objects.filter(epoch_id=epoch_pk).values_list(
        "pk", "account_id", "route", "partition")}
    for account_id, route, partition in sorted(partitions):
        subject = f"{account_id}:{route}:{partition}"
        lane = lanes.get((account_id, route, partition))
        if lane is None:
            inv.uncovered.append(["partition", subject, "no OrderingLane of the candidate epoch (lane authority)"])
        else:
            inv.entries.append(["partition", subject, f"{authorities['partition']}:lane#{lane}"])
    return inv


def activation_inventory_lost(*, configuration_pk: int, epoch_pk: int,
                              partitions: list[tuple[int, str, str]] = ()) -> list[list[str]]:
    """The authorities a frozen inventory named that are gone since (a recheck before the activation transaction,
    D-320): an account of the configuration without its serving gate, a mapped credential generation without its
    dispatch gate, a certified partition without its OrderingLane of the candidate epoch. Everything else the
    inventory read is immutable (the configuration, the epoch's binding proofs) or compared again under the
    activation's locks (each gate's mode, its held evidence). Three set-based reads, whatever the account count."""
    lost: list[list[str]] = []
    accounts = ServiceConfigurationAccount.objects.filter(generation_id=configuration_pk).values_list("account_id",
                                                                                                     flat=True)
    gated = set(AccountServingGate.objects.filter(account_id__in=accounts).values_list("account_id", flat=True))
    lost += [["account", str(a), "no serving gate"] for a in accounts if a not in gated]
    lost += [["dispatch", f"{a}:{ref}", "credential generation without a dispatch gate"]
             for a, ref in ServiceConfigurationCredentialMapping.objects.filter(
                 generation_id=configuration_pk, credential_generation__dispatch_gate__isnull=True)
             .values_list("account_id", "credential_ref")]
    if partitions:
        lanes = set(OrderingLane.objects.filter(epoch_id=epoch_pk).values_list("account_id", "route", "partition"))
        lost += [["partition", f"{a}:{r}:{p}", "no OrderingLane of the candidate epoch (lane authority)"]
                 for a, r, p in sorted(partitions) if (a, r, p) not in lanes]
    return lost
