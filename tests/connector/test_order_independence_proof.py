"""An `order_independent` route carries a conformance proof that L0 checks (D-310): at pack install, where the
epoch candidate sees the route's mapping, and again at epoch verification. Never taken on the definition's word."""
from __future__ import annotations

import copy

import pytest

from connector.choices import BindingKind, EpochState
from connector.interpreters import ordering_proof
from connector.interpreters.ordering_proof import OrderIndependenceUnproven
from connector.models import BindingDefinition, PackGeneration, ServingEpoch
from connector.selectors.routes import route_ordering_proof
from connector.services import owners, serving
from tests.conformance.packs import PACK_B, versioned_writes
from tests.connector.inbound_helpers import ACTOR, build_inbound_world

GROUPED = "ledger.grouped"


def _install(generation_id: str, route: dict) -> PackGeneration:
    return owners.pack_generation_install(
        generation_id=generation_id, owner_pack="ledger-feed", pack_installation_id="ledger-feed.inst", actor=ACTOR,
        definitions=[{"kind": BindingKind.INBOUND_ROUTE, "business_key": GROUPED, "version": 1,
                      "definition": route}])


@pytest.mark.django_db
def test_pack_install_refuses_an_order_independent_route_whose_proof_does_not_check():
    """An order_independent route is installed only with a proof whose every write commutes or compares a source
    version: no proof, an unconditional (last-arrival-wins) replace, a version-guarded write without the route's
    source version, a key outside the closed shape, or a partial mapped route each refuse with
    ORDER_INDEPENDENCE_UNPROVEN and write nothing; the valid proof installs. Proves: CV2-06-003"""
    route = PACK_B["routes"][GROUPED]
    bad = {
        "absent": {k: v for k, v in route.items() if k != "order_independence"},
        "replace": {**route, "order_independence": {"writes": [{"target": "display_name", "operation": "replace"},
                                                               {"target": "email", "operation": "set_union"}]}},
        "no_version": {**route, "order_independence": {"writes": [
            {"target": "display_name", "operation": "replace_if_newer_source_version"}]}},
        "open_shape": {**route, "order_independence": {**route["order_independence"], "trust_me": True}},
        "every_field_of_mapped": {**route, "order_independence": {"writes": [{"target": "*",
                                                                              "operation": "insert_if_absent"}]}},
    }
    for name, definition in bad.items():
        with pytest.raises(OrderIndependenceUnproven) as refused:
            _install(f"bad-{name.replace('_', '-')}.g1", definition)
        assert refused.value.code == "ORDER_INDEPENDENCE_UNPROVEN", name
    assert not PackGeneration.objects.exists() and not BindingDefinition.objects.exists()
    assert _install("good.g1", route).generation_id == "good.g1"


@pytest.mark.django_db
def test_the_epoch_checks_the_proof_against_the_mapping_and_again_at_verification(monkeypatch):
    """A proof that leaves a mapped target out cannot enter an epoch (the candidate sees the mapping); an epoch
    prepared with a valid proof is rejected at verification once L0 no longer accepts its writes, because the
    verification rereads and rechecks every definition; the epoch's route answers its proof digest, which is the
    digest the cutover attaches to its disposition. Proves: CV2-06-003, CV2-06-018"""
    partial = copy.deepcopy(PACK_B)
    partial["routes"][GROUPED]["order_independence"] = versioned_writes(["display_name"], "/seq")
    with pytest.raises(OrderIndependenceUnproven, match="not exactly the mapped targets"):
        build_inbound_world("oip-", [partial])
    assert not ServingEpoch.objects.exists()

    world = build_inbound_world("oiv-", [PACK_B])
    contract, digest = route_ordering_proof(epoch_pk=world.epoch.pk, epoch_digest=bytes(world.epoch.digest),
                                            channel=GROUPED)
    assert contract == "order_independent"
    assert digest == ordering_proof.proof_digest(PACK_B["routes"][GROUPED])
    candidate = serving.epoch_prepare_from_owners(epoch_id="oiv-epoch-2",
                                                  configuration_generation_id=world.configuration.generation_id,
                                                  actor=ACTOR)
    monkeypatch.setattr(ordering_proof, "COMMUTING_OPERATIONS", ("set_union", "insert_if_absent"))
    rejected = serving.epoch_verify(epoch_pk=candidate.pk, actor=ACTOR)
    assert rejected.state == EpochState.REJECTED
    assert "replace_if_newer_source_version" in rejected.rejection_detail
