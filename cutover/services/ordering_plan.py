"""The ordering-migration plan of a V1 -> V2 cutover (seed "Durable source ordering", CV2-06-003..028, D-311/D-312).

Every route receives one immutable disposition in the CutoverReadinessCertificate before maintenance. The plan is
computed, never taken on the owner's word, from three authorities: the V1 owner's route contracts (disposition,
typed source-order facts), the frozen ConnectorServiceConfigurationGeneration (which routes any account enables)
and the candidate epoch's route definitions (the ordering contract and, for `order_independent`, the conformance
proof L0 checks again here):

- `order_independent`: the candidate epoch's route is `order_independent`, its conformance proof checks, and the
  disposition's proof digest is exactly that proof's digest (attached to the certificate entry);
- `v1_high_water` / `provider_snapshot_barrier`: the owner exposes typed SourceOrderFacts (a source-assigned
  position, never an enqueue ordinal, arrival order or queue row; a closed position kind; comparator;
  tie-breaker; partition derivation; exhaustive partitions), their digest is the disposition's proof digest, and
  the candidate epoch's route is order-dependent;
- `unsupported`: allowed only when no account of the frozen configuration generation enables the route (a
  separately authorized generation disabled it before the attempt froze its account set); otherwise refused.

An enabled route without a disposition is refused. Each refusal carries a stable reason code (ORDERING_REASONS).
`plan_dry_run` answers the same questions without an attempt and writes nothing; `plan_revalidate` recomputes the
plan of an attempt and byte-compares it with the certificate's entries before the baselines are captured and
before the shutdown certificate, so the post-drain capture only executes the already proved plan.
"""
from __future__ import annotations

import json

from connector.errors import ConnectorError
from connector.selectors.routes import route_ordering_proof
from connector.selectors.rows import ServiceConfigurationGeneration, ServingEpoch
from cutover.errors import OrderingPlanDrifted
from cutover.models import OrderingDisposition
from cutover.ports import POSITION_KINDS, POSITION_SOURCES_REFUSED, RouteHaltContract, v1_owner

ORDERED = (OrderingDisposition.V1_HIGH_WATER, OrderingDisposition.PROVIDER_SNAPSHOT_BARRIER)
#: The closed reason codes of an ordering-plan refusal (docs/cutover.md).
ORDERING_REASONS = {
    "ORDERING_DISPOSITION_MISSING": "an enabled route has no ordering-migration disposition",
    "ORDERING_DISPOSITION_NOT_CLOSED": "the disposition is not one of the four closed values",
    "ORDERING_UNSUPPORTED_ENABLED": "an unsupported route is enabled in the frozen configuration generation",
    "ORDER_INDEPENDENCE_UNPROVEN": "the route's conformance proof is absent, invalid or not the attached one",
    "SOURCE_ORDER_FACTS_INCOMPLETE": "no typed position, comparator, tie-breaker or exhaustive partition set",
    "ARRIVAL_ORDER_NOT_HIGH_WATER": "the position is an enqueue ordinal, arrival order or a queue row",
    "ORDERING_PROOF_MISMATCH": "the disposition's proof digest is not the digest of the facts it names",
    "ORDERING_CONTRACT_MISMATCH": "the candidate epoch's route contract contradicts the disposition",
}


def enabled_routes(configuration: ServiceConfigurationGeneration) -> set[str]:
    return {r for routes in configuration.accounts.values_list("enabled_routes", flat=True) for r in routes or ()}


def _facts_problem(route: RouteHaltContract) -> tuple[str, str] | None:
    facts = route.source_order
    if facts is None or facts.position_kind not in POSITION_KINDS or not facts.comparator \
            or not facts.tie_breaker or not facts.partition_key or not facts.exhaustive_partitions \
            or not facts.position_source:
        return "SOURCE_ORDER_FACTS_INCOMPLETE", "the V1 owner exposes no complete typed source-order facts"
    if facts.position_source in POSITION_SOURCES_REFUSED or facts.comparator in POSITION_SOURCES_REFUSED:
        return "ARRIVAL_ORDER_NOT_HIGH_WATER", f"position {facts.position_source}/{facts.comparator} is not a " \
                                               "source high-water"
    if bytes(route.disposition_proof_digest) != facts.digest:
        return "ORDERING_PROOF_MISMATCH", "the proof digest is not the digest of the route's source-order facts"
    return None


def _entry(route: RouteHaltContract, enabled: set[str], epoch: ServingEpoch,
           configuration: ServiceConfigurationGeneration) -> tuple[dict, tuple[str, str] | None]:
    """(certificate entry, None or (reason code, detail)) of one route contract."""
    disposition = route.ordering_disposition
    entry = {"route": route.route_key, "disposition": disposition, "lossless_halt": route.lossless_halt,
             "proof": bytes(route.disposition_proof_digest).hex(), "owner": route.remediation_owner,
             "enabled": route.route_key in enabled,
             "source_order": None if route.source_order is None else route.source_order.as_dict()}
    if disposition not in OrderingDisposition.values:
        return entry, ("ORDERING_DISPOSITION_NOT_CLOSED", f"disposition {disposition!r}")
    if not entry["enabled"]:  # no account enables it: V2 serves nothing of it, no lane, no baseline
        entry["disabled_by"] = configuration.generation_id
        return entry, None
    if disposition == OrderingDisposition.UNSUPPORTED:
        return entry, ("ORDERING_UNSUPPORTED_ENABLED", f"disposition unsupported, enabled by configuration "
                                                       f"{configuration.generation_id}")
    try:
        found = route_ordering_proof(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), channel=route.route_key)
    except ConnectorError as exc:
        return entry, ("ORDER_INDEPENDENCE_UNPROVEN", f"{exc.code}: {exc.detail}")
    if found is None:
        return entry, ("ORDERING_CONTRACT_MISMATCH", f"candidate epoch {epoch.epoch_id} binds no such route")
    contract, proof = found
    entry["contract"] = contract
    if disposition == OrderingDisposition.ORDER_INDEPENDENT:
        if proof is None:
            return entry, ("ORDERING_CONTRACT_MISMATCH", f"the candidate epoch's route is {contract}")
        if bytes(route.disposition_proof_digest) != proof:
            return entry, ("ORDER_INDEPENDENCE_UNPROVEN", "the attached proof digest is not the route's "
                                                          "conformance proof")
        return entry, None
    if proof is not None:
        return entry, ("ORDERING_CONTRACT_MISMATCH", "the candidate epoch's route is order_independent")
    return entry, _facts_problem(route)


def plan(*, configuration: ServiceConfigurationGeneration, epoch: ServingEpoch,
         routes: list[RouteHaltContract]) -> tuple[list[dict], list[str]]:
    """(certificate route entries, problems) for the owner's route contracts against the configuration and
    epoch. Each problem is `route <key>: <REASON_CODE>: detail`."""
    enabled = enabled_routes(configuration)
    entries, problems = [], []
    for route in sorted(routes, key=lambda r: r.route_key):
        entry, problem = _entry(route, enabled, epoch, configuration)
        entries.append(entry)
        if problem is not None:
            problems.append(f"route {route.route_key}: {problem[0]}: {problem[1]}")
    covered = {r.route_key for r in routes}
    problems += [f"route {key}: ORDERING_DISPOSITION_MISSING: enabled by configuration "
                 f"{configuration.generation_id} without a disposition" for key in sorted(enabled - covered)]
    return entries, problems


def plan_dry_run(*, configuration_generation_id: str, candidate_epoch_id: str) -> list[str]:
    """The eligibility dry run (CV2-06-023): the ordering problems a preflight of this configuration and epoch
    would refuse, read-only (no attempt, no certificate, no barrier)."""
    configuration = ServiceConfigurationGeneration.objects.get(generation_id=configuration_generation_id)
    epoch = ServingEpoch.objects.get(epoch_id=candidate_epoch_id)
    return plan(configuration=configuration, epoch=epoch, routes=v1_owner().route_contracts())[1]


def _canonical(entries: list[dict]) -> str:
    return json.dumps(entries, sort_keys=True, separators=(",", ":"))


def plan_revalidate(attempt, certificate) -> dict[str, dict]:
    """Recompute the attempt's plan against its frozen configuration and candidate epoch and byte-compare it with
    the certificate's route entries; returns {route key: entry}. Raises OrderingPlanDrifted (writes nothing)."""
    entries, problems = plan(configuration=attempt.configuration, epoch=attempt.candidate_epoch,
                             routes=v1_owner().route_contracts())
    if problems or _canonical(entries) != _canonical(list(certificate.routes)):
        raise OrderingPlanDrifted("the ordering plan differs from the readiness certificate's: "
                                  + ("; ".join(problems) or "a route's disposition, proof or facts changed"))
    return {e["route"]: e for e in entries}
