"""A golden vector of one ServingEpoch preimage: the field list and the order of every part, pinned byte for byte.

The expected bytes are written here by hand, field by field in the seed's order, with `struct` only (the byte
layout of docs/digest-profiles.md: tag, u32 length framing, i64 integers), not with the product's encoder. The
SHA-256 of the vector is FROZEN: if either assertion fails, the epoch preimage has drifted, and a different
layout is a new profile, never an edit of this file. Pure Python: no database.
"""
from __future__ import annotations

import hashlib
import struct

from connector.canonical.profiles import V2_PROFILE_ID
from connector.selectors.epoch_candidate import (
    BindingProof,
    CatalogAttestation,
    ConfigurationProof,
    CredentialProof,
    EpochCandidate,
    epoch_preimage,
)

# The frozen digest of the vector below (computed once, checked against the hand-built bytes).
GOLDEN_SHA256 = "fa2f7923103901555aa2e4ac4287d827618542a45afaa31be2584f5b999137a7"


def _u32(n):
    return struct.pack(">I", n)


def T(s):  # text
    b = s.encode()
    return b"\x01" + _u32(len(b)) + b


def B(b):  # bytes
    return b"\x02" + _u32(len(b)) + b


def I(n):  # noqa: E743 - integer
    return b"\x03" + struct.pack(">q", n)


NULL = b"\x00"


def L(*items):
    return b"\x05" + _u32(len(items)) + b"".join(items)


def R(*fields):  # record: (name, encoded value) pairs, in declared order
    return b"\x06" + _u32(len(fields)) + b"".join(T(name) + value for name, value in fields)


def D(domain):
    b = domain.encode()
    return b"\xd5" + _u32(len(b)) + b


def _candidate(*, runtime=("cmd-def-1", 3)) -> EpochCandidate:
    return EpochCandidate(
        profile_id=V2_PROFILE_ID, epoch_id="ep-1", serving_scope_digest=b"\x5c" * 4,
        catalog=CatalogAttestation(
            view_key="view-a", revision=7, organization="org-1", application_installation="inst-1",
            authorized_workload="wl-1", lineage_revision="lin-2", source_snapshot_digest=b"\x01\x02",
            view_digest=b"\x03\x04", receipt_protocol="cat.r.v1", security_epoch=5, capability_version="cap-9"),
        configuration=ConfigurationProof(
            generation_protocol="cfg.g.v1", receipt_protocol="cfg.r.v1", generation_id="gen-1",
            generation_digest=b"\x0a", owner_receipt=b"CFGRCPT", owner_receipt_digest=b"\x0b"),
        bindings=(BindingProof(
            ordinal=0, row_id="row-1", identity_digest=b"\x11", kind="inbound_route", owner_pack="pack-a",
            pack_installation_id="pi-1", pack_payload_digest=b"\x12", business_key="bk-1", definition_version=2,
            credential_refs=("cred-a",), runtime=runtime, pack_generation_id="pg-1",
            definition_envelope_version=1, definition_receipt_version=1, canonical_definition_digest=b"\x13",
            owner_receipt=b"DEFRCPT", owner_receipt_digest=b"\x14"),),
        credentials=(CredentialProof(
            ordinal=0, generation_id="cg-1", receipt_protocol="cred.r.v1", transport_config_digest=b"\x21",
            owner_receipt=b"CREDRCPT", owner_receipt_digest=b"\x22"),))


def _expected(runtime_bytes) -> bytes:
    """The seed's closed order, spelled out. CV2-01-016: domain prefix (profile ID framed in the domain, epoch ID,
    ServingScopeDigest), Catalog attestation, Service Configuration proof, bindings with owner proofs,
    credential proofs."""
    catalog = R(  # CV2-01-017
        ("organization", T("org-1")), ("application_installation", T("inst-1")),
        ("authorized_workload", T("wl-1")), ("lineage_revision", T("lin-2")),
        ("source_snapshot_digest", B(b"\x01\x02")), ("view_digest", B(b"\x03\x04")),
        ("receipt_protocol", T("cat.r.v1")),
        ("revision", R(("view_key", T("view-a")), ("revision", I(7)), ("lineage_revision", T("lin-2")))),
        ("security_epoch", I(5)), ("capability_version", T("cap-9")))
    configuration = R(  # CV2-01-018
        ("generation_protocol", T("cfg.g.v1")), ("receipt_protocol", T("cfg.r.v1")),
        ("generation_id", T("gen-1")), ("generation_digest", B(b"\x0a")),
        ("owner_receipt", B(b"CFGRCPT")), ("owner_receipt_digest", B(b"\x0b")))
    # the canonical CredentialRefs blob is itself a framed list under the Catalog binding protocol's domain
    refs_blob = D("nexuscrm.catalog.binding-identity.v1/credential-refs") + L(T("cred-a"))
    binding = R(  # CV2-01-019, then its owner proof immediately inside it (CV2-01-020)
        ("ordinal", I(0)), ("row_id", T("row-1")), ("identity_digest", B(b"\x11")), ("kind", T("inbound_route")),
        ("owner_pack", T("pack-a")), ("pack_installation_id", T("pi-1")), ("pack_payload_digest", B(b"\x12")),
        ("business_key", T("bk-1")), ("definition_version", I(2)), ("credential_refs", B(refs_blob)),
        ("runtime", runtime_bytes),
        ("owner_proof", R(
            ("pack_generation_id", T("pg-1")), ("definition_envelope_version", I(1)),
            ("definition_receipt_version", I(1)), ("canonical_definition_digest", B(b"\x13")),
            ("owner_receipt", B(b"DEFRCPT")), ("owner_receipt_digest", B(b"\x14")))))
    credential = R(  # CV2-01-021
        ("ordinal", I(0)), ("generation_id", T("cg-1")), ("receipt_protocol", T("cred.r.v1")),
        ("transport_config_digest", B(b"\x21")), ("owner_receipt", B(b"CREDRCPT")),
        ("owner_receipt_digest", B(b"\x22")))
    return D(f"{V2_PROFILE_ID}/serving-epoch") + R(
        ("epoch_id", T("ep-1")), ("serving_scope_digest", B(b"\x5c" * 4)),
        ("catalog", catalog), ("service_configuration", configuration),
        ("bindings", L(binding)),  # the count, then each binding by ordinal
        ("credentials", L(credential)))  # the count, then each generation


def test_epoch_preimage_golden_vector():
    """One small fixed epoch: the preimage equals, byte for byte, the hand-built encoding of the seed's field
    list in the seed's order, and its SHA-256 is frozen. Catalog attestation (organization, installation,
    workload, lineage revision, snapshot and view digests, receipt protocol, repeated revision tuple, security
    epoch, capability version); Service Configuration proof (generation protocol, receipt protocol, generation
    ID and digest, owner receipt bytes and digest); binding count then each binding by ordinal with the exact
    optional Runtime tuple, followed immediately by its owner proof.
    Proves: CV2-01-017, CV2-01-018, CV2-01-019, CV2-01-020"""
    preimage = epoch_preimage(_candidate())
    runtime = R(("command_definition_id", T("cmd-def-1")), ("version", I(3)))
    assert preimage == _expected(runtime)
    assert hashlib.sha256(preimage).hexdigest() == GOLDEN_SHA256


def test_absent_runtime_tuple_is_an_explicit_null():
    """A binding without a Runtime command is encoded with an explicit null in the Runtime position (not an
    omitted field), so an absent tuple and any present one never share bytes. Proves: CV2-01-019"""
    preimage = epoch_preimage(_candidate(runtime=None))
    assert preimage == _expected(NULL)
    assert preimage != epoch_preimage(_candidate())
