"""The delivery contract's identities and digests: each is sha256 over `canonical_typed_length_delimited_v1` of a
Record whose fields are exactly the contract's list for that identity, in the contract's order, with the domain
`dpone.rest-bulk-delivery.v1/<identity>`. The field lists are read from the contract (`namespaces`,
`identities`); a missing or extra field is refused, so no caller can leave a field out of an identity or slip a
secret into one.

What goes where follows the contract: the execution policy digest is outside the mutation intent (a policy-only
change keeps the intent), the receiver binding semantics digest is inside it (a principal swap changes it) and holds
no secret (a rotation changes nothing), and the receiver mutation key is (namespace, delivery key) with no payload
digest.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from connector.canonical.encoding import Record
from connector.canonical.profiles import DELIVERY_PROFILE_ID, profile_for

from .contract import contract

DOMAIN_PREFIX = "dpone.rest-bulk-delivery.v1/"


class IdentityFieldsInvalid(ValueError):
    """The fields given for an identity are not exactly the contract's list."""


def identity_fields(name: str) -> tuple[str, ...]:
    raw = contract().raw
    if name == "operation_namespace":
        return tuple(raw["namespaces"]["operation_namespace"]["fields"])
    if name == "effect_conflict_domain":
        return tuple(raw["generation_fence"]["effect_conflict_domain_fields"])
    return tuple(raw["identities"][name]["fields"])


def identity_record(name: str, values: Mapping[str, Any]) -> Record:
    fields = identity_fields(name)
    missing = [f for f in fields if f not in values]
    extra = sorted(set(values) - set(fields))
    if missing or extra:
        raise IdentityFieldsInvalid(f"{name}: missing {missing or 'none'}, unexpected {extra or 'none'}")
    return Record([(f, values[f]) for f in fields])


def identity_digest(name: str, values: Mapping[str, Any]) -> bytes:
    """The 32-byte sha256 digest of identity `name` over exactly its contract fields."""
    return profile_for(DELIVERY_PROFILE_ID).digest(DOMAIN_PREFIX + name, identity_record(name, values))


def operation_namespace(*, platform_instance_id: str, tenant_id: str, environment_id: str,
                        namespace_revision: int) -> bytes:
    return identity_digest("operation_namespace", locals())


def delivery_key(*, logical_route_id: str, target_effect_scope: str, source_boundary: str, mutation_kind: str,
                 explicit_generation: str) -> bytes:
    return identity_digest("delivery_key", locals())


def effect_conflict_domain(**fields: Any) -> bytes:
    """The physical receiver resource generations compete in: no namespace and no mutation kind, so local
    namespaces and mutation kinds writing the same resource share one domain."""
    return identity_digest("effect_conflict_domain", fields)


def receiver_mutation_key(*, operation_namespace: bytes, delivery_key: bytes) -> bytes:
    return identity_digest("receiver_mutation_key", locals())


def receiver_binding_semantics(**fields: Any) -> bytes:
    return identity_digest("receiver_binding_semantics_digest", fields)


def operation_semantics(**fields: Any) -> bytes:
    return identity_digest("operation_semantics_digest", fields)


def rendered_request_semantics(**fields: Any) -> bytes:
    return identity_digest("rendered_request_semantics_digest", fields)


def execution_policy(**fields: Any) -> bytes:
    return identity_digest("execution_policy_digest", fields)


def mutation_intent(*, receiver_binding_semantics_digest: bytes, operation_semantics_digest: bytes,
                    rendered_request_semantics_digest: bytes) -> bytes:
    return identity_digest("mutation_intent_digest", locals())


def profile_contract(*, operation_semantics_digest: bytes, execution_policy_digest: bytes, profile_schema_id: str,
                     profile_version: int) -> bytes:
    return identity_digest("profile_contract_digest", locals())


def parent_plan(*, frozen_parent_digest: bytes, compiled_plan_digest: bytes, profile_contract_digest: bytes,
                planner_algorithm_version: str, ordered_child_descriptors: list, complete_coverage_proof: Record
                ) -> bytes:
    return identity_digest("parent_plan_digest", locals())


def generation_text(interval_end_iso: str, correction_revision: int) -> str:
    """The explicit generation as it enters the delivery key: `<scheduled_interval_end_utc>#<revision>`."""
    return f"{interval_end_iso}#{correction_revision}"
