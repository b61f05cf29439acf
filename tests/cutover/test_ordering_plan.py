"""The ordering-migration plan of the V1 -> V2 cutover against the real V1 (D-311, D-312): every route's
disposition is checked before maintenance, not recorded on the owner's word; the plan is reverified at the
post-drain baseline capture and before the shutdown certificate; baselines carry no V1 event into V2."""
from __future__ import annotations

import dataclasses

import pytest

from connector.choices import GateMode
from connector.demo import ROUTE_DEFINITION
from connector.models import Event, Execution, OrderingLane, Receipt
from connector.selectors.routes import route_ordering_proof
from cutover.errors import CutoverPhaseRefused, OrderingPlanDrifted, OrderingPlanRefused
from cutover.models import (
    CutoverReadinessCertificate,
    MaintenanceBarrierReceipt,
    OrderingBaseline,
    ServiceCutoverAttempt,
    V1ShutdownCertificate,
)
from cutover.ports import HighWater, RouteHaltContract
from cutover.services import ordering_plan
from cutover.services import v1_shutdown as sd
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import ACTOR, BUDGETS, build_v1_world, to_validating
from tests.support import whole_seconds
from v1 import runtime
from v1.models import V1HighWater
from v1.owner import ROUTES, WEBHOOK_ORDER, V1Owner

SNAPSHOT = "records.snapshot"
SNAPSHOT_ROUTE = {  # order-independent: each mapped field is replaced only by a newer source sequence
    **{k: v for k, v in ROUTE_DEFINITION.items() if k not in ("ordering", "terminal_disposition")},
    "ordering_contract": "order_independent",
    "order_independence": {"writes": [{"target": "display_name", "operation": "replace_if_newer_source_version"},
                                      {"target": "email", "operation": "replace_if_newer_source_version"}],
                           "source_version": "/sequence"},
}
WEBHOOK = ROUTES[0]


@pytest.fixture
def provider(settings):
    from tests.effects.receiver import Receiver

    r = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR, "EGRESS_BASE_URL": r.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield r
    r.stop()


def snapshot_contract(proof: bytes) -> RouteHaltContract:
    return RouteHaltContract(SNAPSHOT, True, "order_independent", proof, "records-integration-team")


def facts_contract(**changes) -> RouteHaltContract:
    """The webhook's contract with changed source-order facts, its proof digest the changed facts' own."""
    facts = dataclasses.replace(WEBHOOK_ORDER, **changes)
    return dataclasses.replace(WEBHOOK, source_order=facts, disposition_proof_digest=facts.digest)


def certify(monkeypatch, routes):
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: list(routes))
    return sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)


def refused_reasons(monkeypatch, routes) -> str:
    with pytest.raises(OrderingPlanRefused) as refused:
        certify(monkeypatch, routes)
    assert refused.value.code == "ORDERING_PLAN_REFUSED"
    return refused.value.detail


@pytest.mark.django_db
def test_preflight_checks_each_disposition_before_maintenance(provider, monkeypatch):
    """Before any barrier closes, the certificate is refused for an `order_independent` disposition whose proof
    is not the candidate route's checked conformance proof, a `v1_high_water` route without typed position,
    comparator, tie-breaker or exhaustive partitions, a high-water that is an enqueue ordinal or arrival order
    (even with a self-consistent digest), a proof digest that is not its facts', and an enabled route with no
    disposition; each by its stable reason code, writing nothing, V1 still serving. The exact conformance proof
    digest is attached to the certified `order_independent` entry. Proves: CV2-06-003, CV2-06-008, CV2-06-018,
    CV2-06-019, CV2-06-021, CV2-06-028"""
    world = build_v1_world(extra_routes={SNAPSHOT: SNAPSHOT_ROUTE})
    sd.cutover_open(attempt_key="att-1", configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    contract, proof = route_ordering_proof(epoch_pk=world.epoch.pk, epoch_digest=bytes(world.epoch.digest),
                                           channel=SNAPSHOT)
    assert contract == "order_independent" and len(proof) == 32
    cases = {
        "ORDER_INDEPENDENCE_UNPROVEN": [WEBHOOK, snapshot_contract(b"\1" * 32)],
        "ORDERING_CONTRACT_MISMATCH": [dataclasses.replace(WEBHOOK, ordering_disposition="order_independent"),
                                       snapshot_contract(proof)],
        "SOURCE_ORDER_FACTS_INCOMPLETE": [dataclasses.replace(WEBHOOK, source_order=None), snapshot_contract(proof)],
        "ARRIVAL_ORDER_NOT_HIGH_WATER": [facts_contract(position_source="enqueue_ordinal"),
                                         snapshot_contract(proof)],
        "ORDERING_PROOF_MISMATCH": [dataclasses.replace(WEBHOOK, disposition_proof_digest=b"\2" * 32),
                                    snapshot_contract(proof)],
        "ORDERING_DISPOSITION_MISSING": [WEBHOOK],
    }
    for code, routes in cases.items():
        assert code in refused_reasons(monkeypatch, routes), code
    for changes in ({"exhaustive_partitions": False}, {"tie_breaker": ""}, {"comparator": ""},
                    {"position_kind": "text"}):
        assert "SOURCE_ORDER_FACTS_INCOMPLETE" in refused_reasons(monkeypatch, [facts_contract(**changes),
                                                                                 snapshot_contract(proof)])
    for changes in ({"position_source": "arrival_order"}, {"position_source": "queue_row"},
                    {"comparator": "enqueue_ordinal"}):
        assert "ARRIVAL_ORDER_NOT_HIGH_WATER" in refused_reasons(monkeypatch, [facts_contract(**changes),
                                                                                snapshot_contract(proof)])
    assert not CutoverReadinessCertificate.objects.exists() and not MaintenanceBarrierReceipt.objects.exists()
    assert world.modes() == {GateMode.V1_SERVING}
    world.accept(0, "still-v1", 1)  # V1 still admits: nothing entered maintenance
    certificate = certify(monkeypatch, [WEBHOOK, snapshot_contract(proof)])
    entries = {e["route"]: e for e in certificate.routes}
    assert entries[SNAPSHOT]["disposition"] == "order_independent" and entries[SNAPSHOT]["proof"] == proof.hex()
    assert entries[WEBHOOK.route_key]["source_order"] == WEBHOOK_ORDER.as_dict()
    assert entries[WEBHOOK.route_key]["proof"] == WEBHOOK_ORDER.digest.hex()


@pytest.mark.django_db
@pytest.mark.parametrize("disabled", [False, True])
def test_an_unsupported_route_blocks_the_cutover_unless_the_frozen_configuration_disables_it(provider, monkeypatch,
                                                                                             disabled):
    """An `unsupported` route enabled by the attempt's configuration generation refuses the whole-service cutover
    before maintenance; when a separately authored configuration generation (the owner service, before the attempt
    froze it with its account set) leaves the route disabled, the certificate records it as disabled by that exact
    generation, its V1 high-waters need no baseline, and the service reaches v1_drained. Proves: CV2-06-022"""
    world = build_v1_world(extra_routes={SNAPSHOT: SNAPSHOT_ROUTE},
                           disabled_routes=(SNAPSHOT,) if disabled else ())
    unsupported = RouteHaltContract(SNAPSHOT, True, "unsupported", b"\0" * 32, "records-integration-team")
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: [WEBHOOK, unsupported])
    world.accept(0, "k1", 3)
    V1HighWater.objects.create(account_key=world.keys[0], route_key=SNAPSHOT, partition="snap-1", high_water=9)
    sd.cutover_open(attempt_key="att-1", configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    if not disabled:
        with pytest.raises(OrderingPlanRefused, match="ORDERING_UNSUPPORTED_ENABLED"):
            sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
        assert not CutoverReadinessCertificate.objects.exists() and world.modes() == {GateMode.V1_SERVING}
        return
    certificate = sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
    entry = next(e for e in certificate.routes if e["route"] == SNAPSHOT)
    assert (entry["disposition"], entry["enabled"], entry["disabled_by"]) == (
        "unsupported", False, world.configuration.generation_id)
    approve("readiness_certificate", "att-1")
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.drain(world.generation_id)
    sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED}
    assert list(OrderingBaseline.objects.values_list("route_key", "partition", "high_water")) == [
        ("records.webhook", "rec-1", 3)]


@pytest.mark.django_db
def test_the_post_drain_capture_executes_only_the_proved_plan(provider, monkeypatch):
    """Eligibility is first established by a read-only dry run; after the drain the baseline capture recomputes
    the plan against the frozen generation and refuses (writing nothing) a changed disposition or facts, and a
    high-water compared by an enqueue ordinal instead of the certified comparator; it runs only once ingress is
    fenced (v1_stopped); then it writes one byte-exact baseline per partition from the drained V1 high-waters,
    and the shutdown certificate reverifies the plan again. Proves: CV2-06-023, CV2-06-024, CV2-06-028,
    CV2-06-021"""
    world = build_v1_world()
    assert ordering_plan.plan_dry_run(configuration_generation_id=world.configuration.generation_id,
                                      candidate_epoch_id=world.epoch.epoch_id) == []
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: [facts_contract(position_source="arrival_order")])
    assert "ARRIVAL_ORDER_NOT_HIGH_WATER" in ordering_plan.plan_dry_run(
        configuration_generation_id=world.configuration.generation_id, candidate_epoch_id=world.epoch.epoch_id)[0]
    monkeypatch.undo()
    assert not ServiceCutoverAttempt.objects.exists()  # the dry run wrote nothing
    world.accept(0, "k1", 4)
    world.accept(1, "k2", 7, partition="rec-9")
    sd.cutover_open(attempt_key="att-1", configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    sd.cutover_certify(attempt_key="att-1", budgets=BUDGETS, actor=ACTOR)
    approve("readiness_certificate", "att-1")
    sd.maintenance_close(attempt_key="att-1", actor=ACTOR)
    runtime.drain(world.generation_id)
    with pytest.raises(CutoverPhaseRefused):  # ingress not yet fenced by v1_stopped
        sd.v1_export(attempt_key="att-1", actor=ACTOR)
    sd.v1_stop(attempt_key="att-1", actor=ACTOR)
    real_waters = V1Owner.high_waters
    for patch in (
            ("route_contracts", lambda self: [facts_contract(comparator="integer.v2")]),
            ("route_contracts", lambda self: [facts_contract(position_source="enqueue_ordinal")]),
            ("high_waters", lambda self, keys: [dataclasses.replace(w, comparator="enqueue_ordinal")
                                                for w in real_waters(self, keys)]),
            ("high_waters", lambda self, keys: [*real_waters(self, keys), HighWater(
                world.keys[0], "records.unplanned", b"p", b"5", "integer")])):
        monkeypatch.setattr(V1Owner, *patch)
        with pytest.raises(OrderingPlanDrifted) as drifted:
            sd.v1_export(attempt_key="att-1", actor=ACTOR)
        assert drifted.value.code == "ORDERING_PLAN_DRIFTED"
        assert not OrderingBaseline.objects.exists()
        monkeypatch.undo()
    sd.v1_export(attempt_key="att-1", actor=ACTOR)
    assert sorted(OrderingBaseline.objects.values_list("account__account_key", "partition", "high_water",
                                                       "comparator", "origin")) == [
        (world.keys[0], "rec-1", 4, "integer", "v1_high_water"), (world.keys[1], "rec-9", 7, "integer",
                                                                   "v1_high_water")]
    monkeypatch.setattr(V1Owner, "route_contracts", lambda self: [facts_contract(tie_breaker="arrival_time")])
    with pytest.raises(OrderingPlanDrifted):
        sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert not V1ShutdownCertificate.objects.exists() and world.modes() == {GateMode.V1_STOPPED}
    monkeypatch.undo()
    sd.v1_certify_drained(attempt_key="att-1", actor=ACTOR)
    assert world.modes() == {GateMode.V1_DRAINED}


@pytest.mark.django_db(databases=["default", "journal"], transaction=True)
def test_a_baseline_migrates_no_v1_event_and_makes_none_claimable(provider, settings, tmp_path):
    """The baselines become the candidate epoch's lane high-waters, and that is all: no V2 Receipt, Event or
    Execution exists for the V1 items, no lane has an active execution, and a baseline row names only its
    partition's position (no event, item or lease column). Proves: CV2-06-026, CV2-06-024"""
    settings.CUTOVER_RESTORE_POINT_DIR = str(tmp_path / "restore-points")
    world = build_v1_world()
    world.accept(0, "k1", 4)
    world.accept(1, "k2", 7, partition="rec-9")
    to_validating(world)
    lanes = list(OrderingLane.objects.order_by("partition"))
    assert [(lane.partition, lane.baseline, lane.high_water, lane.baseline_origin, lane.active_execution_id)
            for lane in lanes] == [("rec-1", 4, 4, "v1_high_water", None), ("rec-9", 7, 7, "v1_high_water", None)]
    assert not Receipt.objects.exists() and not Event.objects.exists() and not Execution.objects.exists()
    assert {f.name for f in OrderingBaseline._meta.get_fields()} == {
        "id", "attempt", "account", "route_key", "partition", "high_water", "comparator", "origin", "created_at"}
