"""The delivery contract file drives the running state machine: loader, schema, pinned digest, and the exact
tuples, transitions and catalog the implementation admits."""
from __future__ import annotations

import itertools
import json

import pytest
from django.db import IntegrityError, connection, transaction

from effects.delivery import contract as contract_module
from effects.delivery.contract import AXES, ContractInvalid, contract, load_yaml, parse
from effects.delivery.errors import DeliveryError
from effects.models import DeliveryOperation

C = contract()


def test_duplicate_yaml_keys_are_rejected():
    """A duplicate mapping key anywhere (top level or nested) refuses the whole document.
    Proves: duplicate_yaml_keys_are_rejected"""
    with pytest.raises(ContractInvalid, match="duplicate key 'a'"):
        load_yaml("a: 1\nb: 2\na: 3\n")
    with pytest.raises(ContractInvalid, match="duplicate key 'x'"):
        load_yaml("top:\n  x: 1\n  x: 2\n")
    text = contract_module.CONTRACT_PATH.read_bytes()
    doubled = text.replace(b"status: RESEARCHED\n", b"status: RESEARCHED\nstatus: APPROVED\n", 1)
    with pytest.raises(ContractInvalid, match="duplicate key 'status'"):
        parse(doubled)


def test_contract_validates_against_its_schema_and_schema_refuses_breakage():
    """The shipped contract validates against docs/schema/...schema.json; a legal tuple with four axes, an
    unknown top-level key and a catalog entry without its evidence schema are refused."""
    raw = load_yaml(contract_module.CONTRACT_PATH.read_bytes())
    contract_module.validate_schema(raw)
    assert raw["schema_document"] == "docs/schema/rest-bulk-delivery-design-contract-v1.schema.json"
    broken = json.loads(json.dumps(raw))
    broken["state_machine"]["legal_tuples"]["planned"] = ["PLANNED", "NONE_PROVEN", "NOT_ACCEPTED", "NOT_RUN"]
    with pytest.raises(ContractInvalid, match="legal_tuples/planned"):
        contract_module.validate_schema(broken)
    broken = json.loads(json.dumps(raw))
    broken["surprise"] = 1
    with pytest.raises(ContractInvalid, match="Additional properties"):
        contract_module.validate_schema(broken)
    broken = json.loads(json.dumps(raw))
    del broken["error_catalog"]["REST_DELIVERY_UNSAFE_RETRY"]["evidence_schema"]
    with pytest.raises(ContractInvalid, match="evidence_schema"):
        contract_module.validate_schema(broken)


def test_researched_design_contract_is_immutable_and_approval_is_separate_receipt(tmp_path, monkeypatch):
    """The contract's sha256 is pinned; an edited file is refused at load; the approval is a separate receipt
    row referencing the digest (the file never changes). Proves:
    researched_design_contract_is_immutable_and_approval_is_separate_receipt"""
    assert C.digest == contract_module.PINNED_DIGEST
    assert C.raw["promotion_strategy"]["approval_receipt"]["mutates_researched_contract"] is False
    edited = tmp_path / "c.yaml"
    edited.write_bytes(contract_module.CONTRACT_PATH.read_bytes().replace(b"version: 1", b"version: 1 ", 1))
    monkeypatch.setattr(contract_module, "CONTRACT_PATH", edited)
    contract_module.contract.cache_clear()
    try:
        with pytest.raises(ContractInvalid, match="immutable"):
            contract_module.contract()
    finally:
        monkeypatch.undo()
        contract_module.contract.cache_clear()
    assert contract_module.contract().digest == C.digest


def test_every_failure_scenario_maps_to_a_legal_transition():
    """A transition to an undeclared tuple, a legal tuple matching a forbidden combination, and a failure
    scenario that does not preserve its acknowledgement are refused at load.
    Proves: every_failure_scenario_maps_to_a_legal_transition"""
    import yaml

    raw = load_yaml(contract_module.CONTRACT_PATH.read_bytes())

    def reparse(mutate):
        doc = json.loads(json.dumps(raw))
        mutate(doc)
        return parse(yaml.safe_dump(doc).encode())

    with pytest.raises(ContractInvalid, match="undeclared tuple 'nowhere'"):
        reparse(lambda d: d["state_machine"]["automatic_transitions"].append(
            {"from": "planned", "to": "nowhere", "cas": "revision"}))
    with pytest.raises(ContractInvalid, match="forbidden combination"):
        reparse(lambda d: d["state_machine"]["legal_tuples"].__setitem__(
            "bad", ["SUBMITTING", "NONE_PROVEN", "NOT_ACCEPTED", "NOT_RUN", "BLOCKED"]))
    with pytest.raises(ContractInvalid, match="does not preserve"):
        reparse(lambda d: d["failure_scenarios"]["failed_partial_effect"].__setitem__(
            "acknowledgement_preserved", "SUCCEEDED"))
    for scenario in C.failure_scenarios.values():
        rule = C.transition(scenario.source, scenario.target)
        assert rule is not None and C.axis(scenario.target, "acknowledgement") == scenario.acknowledgement_preserved


def test_contract_counts_match_the_summary():
    assert (len(C.tuples), len(C.edges(operator_only=False)), len(C.edges(operator_only=True)), len(C.terminal),
            len(C.errors), len(C.invariants), len(C.failure_scenarios)) == (61, 40, 66, 29, 13, 35, 10)


def test_stable_error_catalog_is_complete_and_metadata_bearing():
    """Every stable code has exit class, retryability, operator action, alert severity and evidence schema, and
    DeliveryError carries them verbatim. Proves: stable_error_catalog_is_complete_and_metadata_bearing"""
    assert list(C.errors) == C.raw["stable_error_codes"]
    for code, spec in C.errors.items():
        error = DeliveryError(code, "x")
        body = error.as_dict()
        assert body["exit_class"] == spec.exit_class in (2, 4)
        assert body["retryability"] and body["operator_action"] and body["alert_severity"]
        assert body["evidence_schema"].startswith("dpone.rest_delivery_")
    with pytest.raises(KeyError):
        DeliveryError("REST_DELIVERY_NOT_IN_CATALOG", "x")


def test_fsm_admits_exactly_the_contract_transitions():
    """The django-fsm transitions generated on DeliveryOperation are exactly the contract's automatic (to_*)
    and operator-only (reconcile_to_*, with the reconcile permission) edges; for every one of the 61 x 61
    (source, target) pairs, an unlisted pair has no method that can take it.
    Proves: state_cross_product_contains_only_legal_tuples"""
    automatic, operator = set(), set()
    for t in DeliveryOperation._meta.get_field("state").get_all_transitions(DeliveryOperation):
        (operator if t.name.startswith("reconcile_to_") else automatic).add((t.source, t.target))
        if t.name.startswith("reconcile_to_"):
            assert t.permission == "effects.reconcile_delivery"
    assert automatic == C.edges(operator_only=False)
    assert operator == C.edges(operator_only=True)
    op = DeliveryOperation()
    for source, target in itertools.product(C.tuples, repeat=2):
        if source == target:
            continue
        op.__dict__["state"] = source
        legal = (source, target) in C.edges()
        possible = any(getattr(op, f"{prefix}{target}", None) is not None
                       and _can(op, getattr(op, f"{prefix}{target}")) for prefix in ("to_", "reconcile_to_"))
        assert possible == legal, (source, target)


def _can(op, method) -> bool:
    from django_fsm import can_proceed

    return can_proceed(method, check_conditions=False)


def test_axis_columns_are_generated_from_the_state(db):
    """The five axis columns are PostgreSQL generated columns of `state`: every legal tuple's row reads back its
    contract axes, a state outside the 61 is refused by a check constraint, and an unlisted edge by the trigger.
    Proves: state_cross_product_contains_only_legal_tuples"""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef d JOIN pg_attribute a ON "
                       "a.attrelid = d.adrelid AND a.attnum = d.adnum WHERE d.adrelid = "
                       "'effects_deliveryoperation'::regclass AND a.attname = 'checkpoint'")
        (expression,) = cursor.fetchone()
    for name, values in C.tuples.items():
        assert f"'{name}'" in expression and f"'{values[AXES.index('checkpoint')]}'" in expression
    assert len(C.forbidden) == 4


@pytest.mark.django_db(databases=["default", "journal"])
def test_state_cross_product_contains_only_legal_tuples(world):
    """Raw SQL cannot move an operation along an edge the contract does not list, nor to a name that is not a
    legal tuple; listed edges pass the trigger. Proves: state_cross_product_contains_only_legal_tuples"""
    parent = world.plan()
    op = parent.children.first()
    assert op.state == "sealed"
    for bad in ("final_full_promoted", "accepted", "planned"):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE effects_deliveryoperation SET state = %s WHERE id = %s", [bad, op.pk])
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE effects_deliveryoperation SET state = 'made_up' WHERE id = %s", [op.pk])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE effects_deliveryoperation SET state = 'submitting' WHERE id = %s RETURNING "
                       "execution, remote_effect, acknowledgement, verification, checkpoint", [op.pk])
        assert cursor.fetchone() == C.tuples["submitting"]
        transaction.set_rollback(True)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE effects_deliveryoperation SET revision = 0 WHERE id = %s", [op.pk])


def test_successful_acknowledgement_preserved_on_partial_or_unknown_effect():
    """Every transition (automatic or operator-only) into a partial or unknown effect from a SUCCEEDED
    acknowledgement keeps SUCCEEDED; the end-to-end cases are test_success_count_mismatch_partial and
    test_success_count_missing_unknown. Proves: successful_acknowledgement_preserved_on_partial_or_unknown_effect"""
    moves = [t for t in C.transitions if C.axis(t.source, "acknowledgement") == "SUCCEEDED"
             and C.axis(t.target, "remote_effect") in ("PARTIALLY_APPLIED", "UNKNOWN")]
    assert moves and all(C.axis(t.target, "acknowledgement") == "SUCCEEDED" for t in moves)


def test_expired_acknowledgement_preserved_on_unknown_effect():
    """Proves: expired_acknowledgement_preserved_on_unknown_effect (end to end: test_expired_effect_unknown)"""
    moves = [t for t in C.transitions if C.axis(t.source, "acknowledgement") == "EXPIRED"
             and C.axis(t.target, "remote_effect") == "UNKNOWN"]
    assert moves and all(C.axis(t.target, "acknowledgement") == "EXPIRED" for t in moves)
    assert C.transition("verifying_expired", "final_unknown_expired_ack") is not None
