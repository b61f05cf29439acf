"""The ServingEpoch candidate: its values, the V2 preimage in the seed's closed nested order (CV2-01-016..023),
and the only honest way to build one, from fresh exact-generation owner reads.

Owner identities, digests and receipts enter the preimage as exact opaque bytes; nothing is recanonicalized
(CV2-01-025). Counts and ordinals use the kernel's fixed-width integers, text and bytes its length framing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from connector.canonical.encoding import Record
from connector.canonical.profiles import EPOCH_AUTHORING_PROFILE_ID, profile_for
from connector.canonical.shapes import RecordShape, text_list
from connector.choices import BindingKind
from connector.errors import OwnerFactInvalid
from connector.interpreters import ordering_proof
from connector.receipts import credential_refs_blob, rec
from connector.selectors import owners as owner_readers

EPOCH_PURPOSE = "serving-epoch"
SCOPE_PURPOSE = "serving-scope"
# One record per credential generation: framed by shape, the bytes of the rec(...) it replaces (issue 19, D-272).
CREDENTIAL_PROOF_SHAPE = RecordShape("ordinal", "generation_id", "receipt_protocol", "transport_config_digest",
                                     "owner_receipt", "owner_receipt_digest")


@dataclass(frozen=True)
class CatalogAttestation:
    view_key: str
    revision: int
    organization: str
    application_installation: str
    authorized_workload: str
    lineage_revision: str
    source_snapshot_digest: bytes
    view_digest: bytes
    receipt_protocol: str
    security_epoch: int
    capability_version: str


@dataclass(frozen=True)
class ConfigurationProof:
    generation_protocol: str
    receipt_protocol: str
    generation_id: str
    generation_digest: bytes
    owner_receipt: bytes
    owner_receipt_digest: bytes


@dataclass(frozen=True)
class BindingProof:
    ordinal: int
    row_id: str
    identity_digest: bytes
    kind: str
    owner_pack: str
    pack_installation_id: str
    pack_payload_digest: bytes
    business_key: str
    definition_version: int
    credential_refs: tuple[str, ...]
    runtime: tuple[str, int] | None
    pack_generation_id: str
    definition_envelope_version: int
    definition_receipt_version: int
    canonical_definition_digest: bytes
    owner_receipt: bytes
    owner_receipt_digest: bytes
    profile_id: str | None = EPOCH_AUTHORING_PROFILE_ID


class CredentialProof(NamedTuple):
    """Immutable; a tuple, built once per credential generation by every reread (issue 19, D-272: a frozen
    dataclass cost three times as much). Change one with `_replace`."""

    ordinal: int
    generation_id: str
    receipt_protocol: str
    transport_config_digest: bytes
    owner_receipt: bytes
    owner_receipt_digest: bytes
    profile_id: str | None = EPOCH_AUTHORING_PROFILE_ID


@dataclass(frozen=True)
class EpochCandidate:
    profile_id: str | None
    epoch_id: str
    serving_scope_digest: bytes
    catalog: CatalogAttestation
    configuration: ConfigurationProof
    bindings: tuple[BindingProof, ...]
    credentials: tuple[CredentialProof, ...]


def serving_scope_digest(profile_id: str | None, configuration_generation_id: str,
                         account_keys: tuple[str, ...]) -> bytes:
    return profile_for(profile_id).digest(SCOPE_PURPOSE, rec(
        configuration_generation_id=configuration_generation_id, accounts=text_list(account_keys)))


def _binding_record(b: BindingProof) -> Record:
    return rec(
        ordinal=b.ordinal, row_id=b.row_id, identity_digest=b.identity_digest, kind=b.kind, owner_pack=b.owner_pack,
        pack_installation_id=b.pack_installation_id, pack_payload_digest=b.pack_payload_digest,
        business_key=b.business_key, definition_version=b.definition_version,
        credential_refs=credential_refs_blob(list(b.credential_refs)),
        runtime=None if b.runtime is None else rec(command_definition_id=b.runtime[0], version=b.runtime[1]),
        owner_proof=rec(pack_generation_id=b.pack_generation_id,
                        definition_envelope_version=b.definition_envelope_version,
                        definition_receipt_version=b.definition_receipt_version,
                        canonical_definition_digest=b.canonical_definition_digest,
                        owner_receipt=b.owner_receipt, owner_receipt_digest=b.owner_receipt_digest))


def epoch_preimage(candidate: EpochCandidate) -> bytes:
    """The closed nested V2 order: domain prefix (profile ID framed in the domain separator, epoch ID, scope
    digest); Catalog attestation; Service Configuration proof; binding count then bindings with owner proofs;
    credential proof count then proofs in ascending generation-ID byte order. Read-only profiles refuse."""
    c, s = candidate.catalog, candidate.configuration
    return profile_for(candidate.profile_id).preimage(EPOCH_PURPOSE, rec(
        epoch_id=candidate.epoch_id,
        serving_scope_digest=candidate.serving_scope_digest,
        catalog=rec(organization=c.organization, application_installation=c.application_installation,
                    authorized_workload=c.authorized_workload, lineage_revision=c.lineage_revision,
                    source_snapshot_digest=c.source_snapshot_digest, view_digest=c.view_digest,
                    receipt_protocol=c.receipt_protocol,
                    revision=rec(view_key=c.view_key, revision=c.revision, lineage_revision=c.lineage_revision),
                    security_epoch=c.security_epoch, capability_version=c.capability_version),
        service_configuration=rec(generation_protocol=s.generation_protocol, receipt_protocol=s.receipt_protocol,
                                  generation_id=s.generation_id, generation_digest=s.generation_digest,
                                  owner_receipt=s.owner_receipt, owner_receipt_digest=s.owner_receipt_digest),
        bindings=[_binding_record(b) for b in candidate.bindings],
        credentials=CREDENTIAL_PROOF_SHAPE.many(
            (p.ordinal, p.generation_id, p.receipt_protocol, p.transport_config_digest, p.owner_receipt,
             p.owner_receipt_digest) for p in candidate.credentials)))


def _order_independence_covered(bindings: list, definitions: dict[int, bytes]) -> None:
    """Every `order_independent` route's proof covers exactly the targets of the mapping it names (D-310)."""
    mappings = {b.business_key: json.loads(definitions[b.ordinal]) for b in bindings
                if b.kind == BindingKind.FIELD_MAPPING}
    for b in bindings:
        if b.kind != BindingKind.INBOUND_ROUTE:
            continue
        route = json.loads(definitions[b.ordinal])
        if route["ordering_contract"] == "order_independent" and route.get("mapping"):
            ordering_proof.check_mapping_coverage(b.business_key, route, mappings.get(route["mapping"]))


def candidate_from_owners(*, epoch_id: str, configuration_generation_id: str,
                          profile_id: str | None = EPOCH_AUTHORING_PROFILE_ID) -> EpochCandidate:
    """Fresh-read every owner by exact generation: the L2 configuration, the current Catalog view it names, each
    binding's kind-specific definition owner, and every referenced credential generation (metadata only)."""
    config = owner_readers.service_configuration_read(generation_id=configuration_generation_id)
    catalog = owner_readers.catalog_view_read_current(view_key=config.catalog_view_key)
    if catalog.revision != config.catalog_revision:
        raise OwnerFactInvalid(f"stale owner generation: configuration {config.generation_id} names Catalog "
                               f"{catalog.view_key} r{config.catalog_revision}, the current view is "
                               f"r{catalog.revision}")
    bindings, definitions = [], {}
    for b in catalog.bindings:
        proof = owner_readers.binding_definition_read(
            kind=b.kind, pack_generation_id=b.pack_generation_id, pack_payload_digest=b.pack_payload_digest,
            business_key=b.business_key, definition_version=b.definition_version)
        definitions[b.ordinal] = proof.definition
        bindings.append(BindingProof(
            b.ordinal, b.row_id, b.identity_digest, b.kind, b.owner_pack, b.pack_installation_id,
            b.pack_payload_digest, b.business_key, b.definition_version, b.credential_refs, b.runtime,
            proof.pack_generation_id, proof.definition_envelope_version, proof.definition_receipt_version,
            proof.canonical_definition_digest, proof.owner_receipt, proof.owner_receipt_digest, profile_id))
    _order_independence_covered(bindings, definitions)
    # One query per chunk of generations, each checked as credential_generation_read checks it (issue 19).
    # ... read by the configuration's relation statement itself (D-272): the same rows, every check still made.
    facts = owner_readers.credential_generations_read(generation_ids=config.credential_generation_ids(),
                                                      rows=config.credential_rows)
    credentials = [CredentialProof(ordinal, fact.generation_id, fact.receipt_protocol, fact.transport_config_digest,
                                   fact.receipt, fact.receipt_digest, profile_id)
                   for ordinal, fact in enumerate(facts)]
    return EpochCandidate(
        profile_id=profile_id, epoch_id=epoch_id,
        serving_scope_digest=serving_scope_digest(profile_id, config.generation_id, config.account_keys),
        catalog=CatalogAttestation(
            config.catalog_view_key, config.catalog_revision, catalog.organization,
            catalog.application_installation, catalog.authorized_workload, catalog.lineage_revision,
            catalog.source_snapshot_digest, catalog.view_digest, catalog.receipt_protocol, catalog.security_epoch,
            catalog.capability_version),
        configuration=ConfigurationProof(config.generation_protocol, config.receipt_protocol, config.generation_id,
                                         config.generation_digest, config.receipt, config.receipt_digest),
        bindings=tuple(bindings), credentials=tuple(credentials))
