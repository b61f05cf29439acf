"""The owners' own versioned canonicalization protocols: how each owner derives its digests and its
deterministic, byte-stable receipt. Used at authoring (services) and by the exact-generation readers
(selectors), which recompute and byte-compare, so a tampered or mutated owner row fails closed.

All owner protocols use the delivery kernel `canonical_typed_length_delimited_v1` + sha256 with the protocol
name as domain separator. Connector-owned epoch digests use the ServingEpoch's digest profile instead
(connector.selectors.epoch_candidate); owner bytes enter them only as opaque exact values.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from connector.canonical.encoding import Record, encode
from connector.canonical.shapes import RecordShape

PACK_RECEIPT_PROTOCOL = "nexuscrm.pack-generation.receipt.v1"
DEFINITION_PROTOCOL = "nexuscrm.binding-definition.v1"
DEFINITION_RECEIPT_PROTOCOL = "nexuscrm.binding-definition.receipt.v1"
CATALOG_BINDING_PROTOCOL = "nexuscrm.catalog.binding-identity.v1"
CATALOG_VIEW_PROTOCOL = "nexuscrm.catalog.view.v1"
CATALOG_RECEIPT_PROTOCOL = "nexuscrm.catalog.view-receipt.v1"
CREDENTIAL_RECEIPT_PROTOCOL = "nexuscrm.credential-generation.receipt.v1"
CREDENTIAL_TRANSPORT_PROTOCOL = "nexuscrm.credential.transport-config.v1"
CONFIGURATION_PROTOCOL = "nexuscrm.service-configuration.v1"
CONFIGURATION_RECEIPT_PROTOCOL = "nexuscrm.service-configuration.receipt.v1"


def rec(**fields: Any) -> Record:
    return Record(list(fields.items()))


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes of a pack document or policy value: sorted keys, no insignificant whitespace,
    UTF-8; floats are refused (they have no single canonical spelling)."""

    def check(v: Any) -> None:
        if isinstance(v, float):
            raise ValueError("floats are not canonical; use integers or strings")
        if isinstance(v, dict):
            for key, item in v.items():
                if not isinstance(key, str):
                    raise ValueError("object keys must be strings")
                check(item)
        elif isinstance(v, list):
            for item in v:
                check(item)

    check(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def with_digest(protocol: str, value: Record) -> tuple[bytes, bytes]:
    data = encode(protocol, value)
    return data, sha256(data)


# -- pack generations and binding definitions -------------------------------------------------------------

def pack_receipt(*, generation_id: str, owner_pack: str, pack_installation_id: str, envelope_version: int,
                 receipt_version: int, payload_digest: bytes) -> tuple[bytes, bytes]:
    return with_digest(PACK_RECEIPT_PROTOCOL, rec(
        generation_id=generation_id, owner_pack=owner_pack, pack_installation_id=pack_installation_id,
        definition_envelope_version=envelope_version, definition_receipt_version=receipt_version,
        payload_digest=bytes(payload_digest)))


def definition_digest(*, kind: str, business_key: str, definition_version: int, definition: bytes) -> bytes:
    return with_digest(DEFINITION_PROTOCOL, rec(kind=kind, business_key=business_key,
                                                definition_version=definition_version,
                                                definition=bytes(definition)))[1]


def definition_receipt(*, pack_generation_id: str, kind: str, business_key: str, definition_version: int,
                       canonical_definition_digest: bytes) -> tuple[bytes, bytes]:
    return with_digest(DEFINITION_RECEIPT_PROTOCOL, rec(
        pack_generation_id=pack_generation_id, kind=kind, business_key=business_key,
        definition_version=definition_version, canonical_definition_digest=bytes(canonical_definition_digest)))


# -- Catalog ------------------------------------------------------------------------------------------------

def catalog_binding_identity(*, view_key: str, kind: str, owner_pack: str, pack_installation_id: str,
                             pack_payload_digest: bytes, business_key: str, definition_version: int,
                             credential_refs: list[str], runtime: tuple[str, int] | None) -> bytes:
    return with_digest(CATALOG_BINDING_PROTOCOL, rec(
        view_key=view_key, kind=kind, owner_pack=owner_pack, pack_installation_id=pack_installation_id,
        pack_payload_digest=bytes(pack_payload_digest), business_key=business_key,
        definition_version=definition_version, credential_refs=list(credential_refs),
        runtime=None if runtime is None else rec(command_definition_id=runtime[0], version=runtime[1])))[1]


def credential_refs_blob(credential_refs: list[str]) -> bytes:
    return encode(CATALOG_BINDING_PROTOCOL + "/credential-refs", list(credential_refs))


def catalog_view_digest(*, view_key: str, revision: int, organization: str, application_installation: str,
                        authorized_workload: str, lineage_revision: str, source_snapshot_digest: bytes,
                        binding_identity_digests: list[bytes]) -> bytes:
    return with_digest(CATALOG_VIEW_PROTOCOL, rec(
        view_key=view_key, revision=revision, organization=organization,
        application_installation=application_installation, authorized_workload=authorized_workload,
        lineage_revision=lineage_revision, source_snapshot_digest=bytes(source_snapshot_digest),
        bindings=[bytes(d) for d in binding_identity_digests]))[1]


def catalog_receipt(*, view_key: str, revision: int, view_digest: bytes, receipt_protocol: str,
                    security_epoch: int, capability_version: str) -> tuple[bytes, bytes]:
    return with_digest(CATALOG_RECEIPT_PROTOCOL, rec(
        view_key=view_key, revision=revision, view_digest=bytes(view_digest), receipt_protocol=receipt_protocol,
        security_epoch=security_epoch, capability_version=capability_version))


# -- credentials ----------------------------------------------------------------------------------------------

def transport_config_digest(config: dict[str, Any]) -> bytes:
    return with_digest(CREDENTIAL_TRANSPORT_PROTOCOL, canonical_json(config))[1]


# Shapes of the records recomputed once per credential generation or account by every owner reread: the bytes
# of the `rec(...)` each replaces (connector.canonical.shapes, issue 19, D-272).
CREDENTIAL_RECEIPT_SHAPE = RecordShape("generation_id", "credential_identity", "provider_scope", "account_key",
                                       "secret_version_ref", "transport_config_digest")
CONFIGURATION_ACCOUNT_SHAPE = RecordShape("account_key", "provider_scope", "enabled_routes", "mapping_selections",
                                          "policy_values")
CONFIGURATION_RELATION_SHAPE = RecordShape("account_key", "credential_ref", "credential_generation_id")


def credential_receipt(*, generation_id: str, credential_identity: str, provider_scope: str, account_key: str,
                       secret_version_ref: str, transport_config_digest: bytes) -> tuple[bytes, bytes]:
    data = CREDENTIAL_RECEIPT_SHAPE.encode(CREDENTIAL_RECEIPT_PROTOCOL, generation_id, credential_identity,
                                           provider_scope, account_key, secret_version_ref,
                                           bytes(transport_config_digest))
    return data, sha256(data)


# -- L2 service configuration --------------------------------------------------------------------------------

def configuration_payload(*, generation_id: str, catalog_view_key: str, catalog_revision: int,
                          accounts: list[dict[str, Any]], relation: list[tuple[str, str, str]]) -> bytes:
    """Canonical bytes of a configuration generation. `accounts` in canonical order; `relation` is the
    exhaustive (account_key, credential_ref, credential_generation_id) set, sorted here."""
    return configuration_payload_rows(
        generation_id=generation_id, catalog_view_key=catalog_view_key, catalog_revision=catalog_revision,
        accounts=[(a["account_key"], a["provider_scope"], list(a["enabled_routes"]),
                   canonical_json(a["mapping_selections"]), canonical_json(a["policy_values"])) for a in accounts],
        relation=relation)


def configuration_payload_rows(*, generation_id: str, catalog_view_key: str, catalog_revision: int,
                               accounts: list[tuple[str, str, list[str], bytes, bytes]],
                               relation: list[tuple[str, str, str]]) -> bytes:
    """configuration_payload from tuples: each account (account_key, provider_scope, enabled_routes, canonical
    JSON of mapping_selections, canonical JSON of policy_values), in canonical order."""
    return encode(CONFIGURATION_PROTOCOL, rec(
        generation_id=generation_id, catalog_view_key=catalog_view_key, catalog_revision=catalog_revision,
        accounts=CONFIGURATION_ACCOUNT_SHAPE.many(accounts),
        credential_relation=CONFIGURATION_RELATION_SHAPE.many(sorted(relation))))


def configuration_receipt(*, generation_protocol: str, generation_id: str, generation_digest: bytes
                          ) -> tuple[bytes, bytes]:
    return with_digest(CONFIGURATION_RECEIPT_PROTOCOL, rec(
        generation_protocol=generation_protocol, generation_id=generation_id,
        generation_digest=bytes(generation_digest)))
