"""Identities and digests exactly as the contract lists them."""
from __future__ import annotations

import pytest

from connector.canonical.decoding import decode
from connector.canonical.encoding import encode
from effects.delivery import identity
from effects.delivery.contract import contract


def test_identity_fields_are_the_contracts_and_nothing_else():
    """Each digest takes exactly the contract's fields in order; a missing or extra one is refused."""
    for name in contract().raw["identities"]:
        fields = identity.identity_fields(name)
        assert fields == tuple(contract().raw["identities"][name]["fields"])
        values = {f: f"v-{f}" for f in fields}
        assert len(identity.identity_digest(name, values)) == 32
        with pytest.raises(identity.IdentityFieldsInvalid):
            identity.identity_digest(name, {**values, "secret": "x"})
        with pytest.raises(identity.IdentityFieldsInvalid):
            identity.identity_digest(name, {f: values[f] for f in fields[1:]})
    record = identity.identity_record("delivery_key", {f: "x" for f in identity.identity_fields("delivery_key")})
    domain, decoded = decode(encode(identity.DOMAIN_PREFIX + "delivery_key", record))
    assert domain == "dpone.rest-bulk-delivery.v1/delivery_key" and decoded.names == identity.identity_fields(
        "delivery_key")


def test_receiver_mutation_key_includes_operation_namespace_without_payload_digest():
    """Proves: receiver_mutation_key_includes_operation_namespace_without_payload_digest"""
    assert identity.identity_fields("receiver_mutation_key") == ("operation_namespace", "delivery_key")
    ns1 = identity.operation_namespace(platform_instance_id="p", tenant_id="t", environment_id="e",
                                       namespace_revision=1)
    ns2 = identity.operation_namespace(platform_instance_id="p", tenant_id="t", environment_id="e",
                                       namespace_revision=2)
    key = b"k" * 32
    assert identity.receiver_mutation_key(operation_namespace=ns1, delivery_key=key) != \
        identity.receiver_mutation_key(operation_namespace=ns2, delivery_key=key)


def _binding(**overrides):
    fields = {f: f"v-{f}" for f in identity.identity_fields("receiver_binding_semantics_digest")}
    fields.update(overrides)
    return identity.receiver_binding_semantics(**fields)


def _intent(binding, op=b"o" * 32, rendered=b"r" * 32):
    return identity.mutation_intent(receiver_binding_semantics_digest=binding, operation_semantics_digest=op,
                                    rendered_request_semantics_digest=rendered)


def test_remote_principal_swap_changes_binding_identity():
    """Proves: remote_principal_swap_changes_binding_identity, receiver_binding_semantics_changes_mutation_intent"""
    assert _binding() != _binding(remote_principal_id="other-principal")
    assert _intent(_binding()) != _intent(_binding(remote_principal_id="other-principal"))
    assert contract().raw["receiver_binding"]["certification"]["principal_swap_changes_identity"] is True


def test_policy_only_change_does_not_change_mutation_intent():
    """The execution policy digest feeds the profile contract digest, never the mutation intent.
    Proves: policy_only_change_does_not_change_mutation_intent"""
    assert "execution_policy_digest" not in identity.identity_fields("mutation_intent_digest")
    policy_fields = identity.identity_fields("execution_policy_digest")
    p1 = identity.execution_policy(**{f: "a" for f in policy_fields})
    p2 = identity.execution_policy(**{**{f: "a" for f in policy_fields}, "retry_policy": "b"})
    assert p1 != p2
    op = b"o" * 32
    c1 = identity.profile_contract(operation_semantics_digest=op, execution_policy_digest=p1,
                                   profile_schema_id="s", profile_version=1)
    c2 = identity.profile_contract(operation_semantics_digest=op, execution_policy_digest=p2,
                                   profile_schema_id="s", profile_version=1)
    assert c1 != c2 and _intent(_binding(), op) == _intent(_binding(), op)


def test_rendered_request_semantics_bind_complete_envelope():
    """Every part of the concrete envelope (multipart layout, filename, boundary, headers, sealed payload digest)
    changes the rendered-request digest, and so the intent. Proves: rendered_request_semantics_bind_complete_envelope"""
    fields = identity.identity_fields("rendered_request_semantics_digest")
    base = {f: f"v-{f}" for f in fields}
    digests = {identity.rendered_request_semantics(**base)}
    for f in fields:
        digests.add(identity.rendered_request_semantics(**{**base, f: base[f] + "'"}))
    assert len(digests) == len(fields) + 1
    assert {"sealed_payload_digest", "deterministic_boundary", "deterministic_filename",
            "ordered_scalar_multipart_parts"} <= set(fields)


def test_receiver_binding_semantics_changes_mutation_intent():
    """Any stable binding field (origin, principal, account, namespace, auth semantics, TLS or network policy)
    changes the binding digest and so the mutation intent. Proves: receiver_binding_semantics_changes_mutation_intent"""
    fields = identity.identity_fields("receiver_binding_semantics_digest")
    assert "receiver_binding_semantics_digest" in identity.identity_fields("mutation_intent_digest")
    intents = {_intent(_binding())} | {_intent(_binding(**{f: "changed"})) for f in fields}
    assert len(intents) == len(fields) + 1
