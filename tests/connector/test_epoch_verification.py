"""ServingEpoch preparation and verification against fresh exact-generation owner reads."""
from __future__ import annotations

import dataclasses
import hashlib

import pytest
from django.db import IntegrityError, connection, transaction

from connector.actors import Actor
from connector.canonical.profiles import V1_PROFILE_ID, V2_PROFILE_ID
from connector.choices import EpochState
from connector.demo import build_owners
from connector.errors import (
    CredentialMappingInvalid,
    EpochCandidateInvalid,
    OwnerFactInvalid,
    OwnerUnavailable,
    TransitionRefused,
)
from connector.models import (
    AuditRecord,
    CredentialGeneration,
    ServiceConfigurationGeneration,
    ServingEpoch,
)
from connector.secrets import FileSecretBackend
from connector.selectors.epoch_candidate import candidate_from_owners, epoch_preimage, serving_scope_digest
from connector.services import owners, serving
from tests import dbroles

ACTOR = Actor.system("test")


@pytest.fixture
def owners_world(db):
    return build_owners("v-")


def _candidate(world, epoch_id="cand-1"):
    return candidate_from_owners(epoch_id=epoch_id, configuration_generation_id=world.configuration.generation_id)


def _prepare_and_verify(candidate):
    epoch = serving.epoch_prepare(candidate=candidate, actor=ACTOR)
    return serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)


def test_honest_candidate_verifies_and_records_audit(owners_world):
    """A candidate built from the owners verifies; the transition is audited with the epoch digest.
    Proves: CV2-02-028, CV2-02-035, CV2-02-036, CV2-01-016, CV2-01-008"""
    epoch = _prepare_and_verify(_candidate(owners_world))
    assert epoch.state == EpochState.VERIFIED
    audit = AuditRecord.objects.filter(entity_type="connector.ServingEpoch", action="epoch_verify").get()
    assert (audit.from_state, audit.to_state) == ("prepared", "verified")
    assert bytes(audit.evidence_digest) == bytes(epoch.digest)
    # the profile ID is framed into the preimage's domain separator
    assert bytes(epoch.preimage)[5:5 + len(V2_PROFILE_ID)] == V2_PROFILE_ID.encode()


def test_epoch_digest_changes_with_every_frozen_part(owners_world):
    """Epoch ID, scope, Catalog attestation, configuration receipt, bindings and credential proofs each
    participate in the preimage. Proves: CV2-01-016..CV2-01-021"""
    base = _candidate(owners_world)
    variants = [
        dataclasses.replace(base, epoch_id="cand-2"),
        dataclasses.replace(base, serving_scope_digest=b"\x01" * 32),
        dataclasses.replace(base, catalog=dataclasses.replace(base.catalog, security_epoch=2)),
        dataclasses.replace(base, configuration=dataclasses.replace(base.configuration, owner_receipt=b"x")),
        dataclasses.replace(base, bindings=base.bindings[:-1]),
        dataclasses.replace(base, credentials=base.credentials[:-1]),
    ]
    digests = {hashlib.sha256(epoch_preimage(c)).digest() for c in [base, *variants]}
    assert len(digests) == len(variants) + 1


@pytest.mark.parametrize("tamper,code", [
    ("caller_echoed_config_receipt", "EPOCH_OWNER_MISMATCH"),
    ("caller_echoed_definition_receipt", "EPOCH_OWNER_MISMATCH"),
    ("caller_echoed_credential_receipt", "EPOCH_OWNER_MISMATCH"),
    ("omitted_account", "EPOCH_OWNER_MISMATCH"),
    ("omitted_binding", "EPOCH_OWNER_MISMATCH"),
    ("omitted_credential", "EPOCH_OWNER_MISMATCH"),
    ("secret_version_drift", "EPOCH_OWNER_MISMATCH"),
])
def test_candidate_that_disagrees_with_the_owners_is_rejected(owners_world, tamper, code):
    """Caller-supplied receipts, an omitted account, binding or credential, or a credential proof naming a
    different secret version cannot produce `verified`: verification reconstructs everything from the owners
    and byte-compares. Proves: CV2-02-024, CV2-02-037, CV2-02-038, CV2-02-042, CV2-01-022, CV2-01-025,
    CV2-01-028"""
    c = _candidate(owners_world)
    if tamper == "caller_echoed_config_receipt":
        c = dataclasses.replace(c, configuration=dataclasses.replace(c.configuration, owner_receipt=b"echo"))
    elif tamper == "caller_echoed_definition_receipt":
        b0 = dataclasses.replace(c.bindings[0], owner_receipt=b"echo", owner_receipt_digest=b"\x00" * 32)
        c = dataclasses.replace(c, bindings=(b0, *c.bindings[1:]))
    elif tamper == "caller_echoed_credential_receipt":
        p0 = c.credentials[0]._replace(owner_receipt_digest=hashlib.sha256(b"echo").digest())
        c = dataclasses.replace(c, credentials=(p0, *c.credentials[1:]))
    elif tamper == "omitted_account":
        first = owners_world.accounts[0].account_key
        c = dataclasses.replace(c, serving_scope_digest=serving_scope_digest(
            V2_PROFILE_ID, owners_world.configuration.generation_id, (first,)))
    elif tamper == "omitted_binding":
        c = dataclasses.replace(c, bindings=c.bindings[:-1])
    elif tamper == "omitted_credential":
        kept = [p._replace(ordinal=i) for i, p in enumerate(c.credentials[1:])]
        c = dataclasses.replace(c, credentials=tuple(kept))
    elif tamper == "secret_version_drift":
        from connector import receipts
        g = CredentialGeneration.objects.select_related("account").get(generation_id=c.credentials[0].generation_id)
        drifted, drifted_digest = receipts.credential_receipt(
            generation_id=g.generation_id, credential_identity=g.credential_identity, provider_scope=g.provider_scope,
            account_key=g.account.account_key, secret_version_ref=g.credential_identity + "/v2",
            transport_config_digest=bytes(g.transport_config_digest))
        p0 = c.credentials[0]._replace(owner_receipt=drifted, owner_receipt_digest=drifted_digest)
        c = dataclasses.replace(c, credentials=(p0, *c.credentials[1:]))
    epoch = _prepare_and_verify(c)
    assert epoch.state == EpochState.REJECTED
    assert epoch.rejection_code == code


def test_extra_credential_proof_is_rejected(owners_world):
    """A proof for a generation the configuration does not reference is an addition. Proves: CV2-01-022"""
    extra = owners.credential_generation_create(
        generation_id="zz-unreferenced.g1", credential_identity="crm-api",
        account_key=owners_world.accounts[0].account_key, secret=b"s", transport_config={}, actor=ACTOR)
    c = _candidate(owners_world)
    from connector.selectors.epoch_candidate import CredentialProof
    fact = extra
    proof = CredentialProof(len(c.credentials), fact.generation_id, fact.receipt_protocol,
                            bytes(fact.transport_config_digest), bytes(fact.receipt), bytes(fact.receipt_digest))
    epoch = _prepare_and_verify(dataclasses.replace(c, credentials=(*c.credentials, proof)))
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "EPOCH_OWNER_MISMATCH")


def test_stale_catalog_revision_is_rejected(owners_world):
    """A newer Catalog revision makes the configuration's revision stale: a merely sufficient revision is not
    the complete current view. Proves: CV2-02-012, CV2-02-037, CV2-02-041"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)
    v = owners_world.view
    bindings = [{"kind": b.kind, "pack_generation_id": b.pack_generation.generation_id,
                 "business_key": b.business_key, "definition_version": b.definition_version,
                 "credential_refs": b.credential_refs} for b in v.bindings.order_by("ordinal")]
    owners.catalog_view_publish(view_key=v.view_key, organization=v.organization,
                                application_installation=v.application_installation,
                                authorized_workload=v.authorized_workload, lineage_revision="1.1",
                                source_snapshot_digest=bytes(v.source_snapshot_digest), security_epoch=2,
                                capability_version=v.capability_version, bindings=bindings, actor=ACTOR)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")
    assert "stale owner generation" in epoch.rejection_detail


def test_mutable_credential_locator_cannot_be_prepared(owners_world):
    """A credential named by its mutable identity instead of an exact generation ID is refused before anything
    is written. Proves: CV2-02-020, CV2-02-037"""
    c = _candidate(owners_world)
    p0 = c.credentials[0]._replace(generation_id="crm-api")
    before = ServingEpoch.objects.count()
    with pytest.raises(EpochCandidateInvalid):
        serving.epoch_prepare(candidate=dataclasses.replace(c, credentials=(p0, *c.credentials[1:])), actor=ACTOR)
    assert ServingEpoch.objects.count() == before


@pytest.mark.parametrize("profile", ["", "nexuscrm.connector-digest-profile.v3", V1_PROFILE_ID, None,
                                     "canonical_typed_length_delimited_v1",
                                     " " + V2_PROFILE_ID, V2_PROFILE_ID.upper()])
def test_only_the_v2_profile_authors_candidates(owners_world, profile):
    """Empty, unknown, case/whitespace variants, V1 and legacy unprofiled are refused for authoring, writing
    nothing. Proves: CV2-01-009, CV2-01-010, CV2-01-011, CV2-01-012, CV2-01-013, CV2-01-026"""
    with pytest.raises(EpochCandidateInvalid):
        serving.epoch_prepare(candidate=dataclasses.replace(_candidate(owners_world), profile_id=profile),
                              actor=ACTOR)
    assert ServingEpoch.objects.count() == 0


def test_mixed_profile_graph_is_refused(owners_world):
    """A proof labelled with another profile makes a mixed graph. Proves: CV2-01-012, CV2-01-026"""
    c = _candidate(owners_world)
    b0 = dataclasses.replace(c.bindings[0], profile_id=V1_PROFILE_ID)
    with pytest.raises(EpochCandidateInvalid, match="mixed-profile"):
        serving.epoch_prepare(candidate=dataclasses.replace(c, bindings=(b0, *c.bindings[1:])), actor=ACTOR)


@pytest.mark.parametrize("profile", [None, V1_PROFILE_ID])
def test_retained_legacy_and_v1_epochs_can_never_verify(owners_world, profile):
    """A retained legacy-unprofiled or V1-profile epoch row is read by its exact reader and rejected by
    verification, never relabelled. Proves: CV2-01-010, CV2-01-011, CV2-01-014"""
    legacy = ServingEpoch.objects.create(epoch_id=f"legacy-{profile}", profile_id=profile,
                                         serving_scope_digest=b"\x00" * 32, preimage=b"legacy-bytes",
                                         digest=hashlib.sha256(f"legacy-{profile}".encode()).digest())
    epoch = serving.epoch_verify(epoch_pk=legacy.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "EPOCH_PROFILE_NOT_AUTHORING")
    assert bytes(epoch.preimage) == b"legacy-bytes"  # never recomputed


def test_empty_profile_id_is_refused_by_the_database(owners_world):
    """"" is not an alias for the legacy (null) profile. Proves: CV2-01-013"""
    with pytest.raises(IntegrityError), transaction.atomic():
        ServingEpoch.objects.create(epoch_id="blank", profile_id="", serving_scope_digest=b"\x00" * 32,
                                    preimage=b"", digest=b"\x01" * 32)


def test_owner_unavailable_leaves_candidate_prepared(owners_world, settings):
    """The secret backend unreachable is retryable unavailability: the candidate stays `prepared` and a later
    verification succeeds. Proves: CV2-02-038"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)
    real = settings.CONNECTOR["SECRET_BACKEND_DIR"]
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": real + "-unmounted"}
    with pytest.raises(OwnerUnavailable):
        serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    epoch.refresh_from_db()
    assert epoch.state == EpochState.PREPARED
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": real}
    assert serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR).state == EpochState.VERIFIED


def test_absent_secret_version_rejects_without_reading_secret_bytes(owners_world, monkeypatch):
    """Verification checks that the exact secret version exists (metadata) and never reads secret bytes; a
    removed version is authoritative absence. Proves: CV2-02-021, CV2-02-042"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)

    def no_read(self, ref):
        raise AssertionError("verification must never read secret bytes")

    monkeypatch.setattr(FileSecretBackend, "read", no_read)
    generation = CredentialGeneration.objects.order_by("generation_id").first()
    from connector.secrets import secret_backend
    secret_backend().destroy(generation.secret_version_ref)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")
    assert "absent from the secret backend" in epoch.rejection_detail


def test_secret_bytes_never_enter_the_database(owners_world):
    """No column of any table holds the secret bytes the demo stored. Proves: CV2-02-021"""
    from connector.secrets import secret_backend
    secrets = [secret_backend().read(g.secret_version_ref) for g in CredentialGeneration.objects.all()]
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name FROM information_schema.tables WHERE table_schema='public'")
        tables = [r[0] for r in cursor.fetchall()]
        for table in tables:
            cursor.execute(f'SELECT t::text FROM "{table}" t')
            dump = "\n".join(r[0] for r in cursor.fetchall())
            for secret in secrets:
                assert secret.decode() not in dump, table


def test_mutated_owner_row_fails_closed(owners_world):
    """An owner row changed behind the owner's back (triggers disabled, as corruption would) no longer matches
    its receipt: verification rejects. Proves: CV2-02-044, CV2-01-028"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)
    with connection.cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE connector_bindingdefinition SET definition = convert_to('{\"fields\":[]}', 'UTF8') "
                       "WHERE kind = 'field_mapping'")
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")


def test_verify_twice_is_refused(owners_world):
    """`verified -> verified` is not a transition. Proves: CV2-02-034"""
    epoch = _prepare_and_verify(_candidate(owners_world))
    with pytest.raises(TransitionRefused):
        serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)


def test_reprepare_identical_bytes_is_idempotent_and_different_bytes_refused(owners_world):
    """Same epoch ID with identical bytes returns the same row; with different bytes it is refused."""
    c = _candidate(owners_world)
    first = serving.epoch_prepare(candidate=c, actor=ACTOR)
    assert serving.epoch_prepare(candidate=c, actor=ACTOR).pk == first.pk
    with pytest.raises(EpochCandidateInvalid):
        serving.epoch_prepare(candidate=dataclasses.replace(c, serving_scope_digest=b"\x02" * 32), actor=ACTOR)


# -- the L2 credential relation --------------------------------------------------------------------------------

def _relation(world):
    return [(m.account.account_key, m.credential_ref, m.credential_generation.generation_id)
            for m in world.configuration.credential_mappings.select_related("account", "credential_generation")]


@pytest.mark.parametrize("change", ["missing", "extra", "duplicate", "wrong_account", "wrong_identity"])
def test_configuration_requires_an_exact_exhaustive_credential_relation(owners_world, change):
    """Missing, extra or duplicate (account, CredentialRef) mappings and a generation scoped to another
    account or identity are refused; nothing is written. Proves: CV2-02-015, CV2-02-016, CV2-02-043"""
    relation = _relation(owners_world)
    a0, a1 = (a.account_key for a in owners_world.accounts)
    if change == "missing":
        relation = relation[1:]
    elif change == "extra":
        relation.append((a0, "unbound-ref", relation[0][2]))
    elif change == "duplicate":
        relation.append(relation[0])
    elif change == "wrong_account":
        other = next(r for r in relation if r[0] == a1 and r[1] == "crm-api")
        relation = [(a, r, other[2]) if (a, r) == (a0, "crm-api") else (a, r, g) for a, r, g in relation]
    elif change == "wrong_identity":
        signing = next(r for r in relation if r[0] == a0 and r[1] == "webhook-signing")
        relation = [(a, r, signing[2]) if (a, r) == (a0, "crm-api") else (a, r, g) for a, r, g in relation]
    before = ServiceConfigurationGeneration.objects.count()
    with pytest.raises(CredentialMappingInvalid):
        owners.service_configuration_create(
            generation_id="config.g2", catalog_view_key=owners_world.view.view_key, catalog_revision=1,
            accounts=[{"account_key": a0, "enabled_routes": ["records.webhook"]},
                      {"account_key": a1, "enabled_routes": ["records.webhook"]}],
            credential_relation=relation, actor=ACTOR)
    assert ServiceConfigurationGeneration.objects.count() == before


def test_owner_receipts_are_byte_stable(owners_world):
    """Reading the same exact generations twice yields byte-identical receipts and the same candidate bytes.
    Proves: CV2-02-017"""
    assert epoch_preimage(_candidate(owners_world)) == epoch_preimage(_candidate(owners_world))


def test_owner_reread_of_credential_generations_is_constant_in_statements(db):
    """The reread before verification and activation reads every credential generation of the configuration
    (two per account) with one query per chunk, not one each, and still checks each one: the statement count is
    the same for 2 and for 12 accounts. (issue 19, R27)"""
    from django.test.utils import CaptureQueriesContext

    counts = []
    for accounts in (2, 12):
        world = build_owners(f"rr{accounts}-", account_keys=tuple(f"acct-{i}" for i in range(accounts)))
        with CaptureQueriesContext(connection) as queries:
            candidate = candidate_from_owners(epoch_id=f"rr{accounts}-epoch",
                                              configuration_generation_id=world.configuration.generation_id)
        assert len(candidate.credentials) == 2 * accounts
        counts.append(len(queries))
    assert counts[0] == counts[1]


def test_the_last_credential_generation_in_order_is_checked_too(owners_world):
    """A secret version missing for the last generation of the byte-ordered set rejects the candidate naming
    that generation: the batched reread checks every row, not just the first. Proves: CV2-02-021"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)
    generation = max(CredentialGeneration.objects.all(), key=lambda g: g.generation_id.encode("utf-8"))
    from connector.secrets import secret_backend
    secret_backend().destroy(generation.secret_version_ref)
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")
    assert f"credential generation {generation.generation_id}: secret version" in epoch.rejection_detail


def test_owner_reread_reads_generations_in_one_statement_and_lists_secrets_per_identity(db, monkeypatch):
    """The reread reads every credential generation of the configuration with ONE statement (an array
    parameter, not one placeholder or one query per id) and checks the secret versions with one directory listing
    per credential identity, never one stat per version, while still checking each generation: the statement
    count is the same for 2 and for 30 accounts and `version_exists` is never asked. (issue 19, D-207, R27)
    Proves: CV2-02-021"""
    from django.test.utils import CaptureQueriesContext

    stats = []
    real_exists = FileSecretBackend.version_exists
    monkeypatch.setattr(FileSecretBackend, "version_exists",
                        lambda self, ref: stats.append(ref) or real_exists(self, ref))
    counts = []
    for accounts in (2, 30):
        world = build_owners(f"one{accounts}-", account_keys=tuple(f"acct-{i}" for i in range(accounts)))
        with CaptureQueriesContext(connection) as queries:
            candidate = candidate_from_owners(epoch_id=f"one{accounts}-epoch",
                                              configuration_generation_id=world.configuration.generation_id)
        assert len(candidate.credentials) == 2 * accounts
        # since D-272 the configuration's relation statement itself reads the generation rows it joins
        generation_reads = [q["sql"] for q in queries
                            if "connector_credentialgeneration AS g" in q["sql"] and "g.receipt_digest" in q["sql"]]
        assert len(generation_reads) == 1
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert stats == []


@pytest.mark.parametrize("broken", ["absent", "receipt", "secret"])
def test_batched_reread_raises_for_the_first_failing_generation_in_order(owners_world, broken):
    """Two generations broken in different ways: the batched reread raises for the one that comes first in
    ascending generation-ID byte order, with the same message the per-generation reader gives it, whatever
    check fails (absent row, receipt mismatch, missing secret version). Proves: CV2-02-021, CV2-02-036"""
    from connector.secrets import secret_backend
    from connector.selectors import owners as owner_readers

    ids = sorted(CredentialGeneration.objects.values_list("generation_id", flat=True), key=str.encode)
    first, later = ids[1], ids[-1]
    secret_backend().destroy(CredentialGeneration.objects.get(generation_id=later).secret_version_ref)
    asked = list(ids)
    if broken == "absent":
        asked[1] = first = first + "-missing"
    elif broken == "receipt":
        with connection.cursor() as cursor:  # corruption behind the owner's back, as in the test above
            dbroles.admin_on(cursor)
            cursor.execute("SET session_replication_role = replica")
            cursor.execute("UPDATE connector_credentialgeneration SET provider_scope = 'elsewhere' "
                           "WHERE generation_id = %s", [first])
            cursor.execute("SET session_replication_role = origin")
            dbroles.admin_off(cursor)
    else:
        secret_backend().destroy(CredentialGeneration.objects.get(generation_id=first).secret_version_ref)
    with pytest.raises(OwnerFactInvalid) as batched:
        owner_readers.credential_generations_read(generation_ids=asked)
    with pytest.raises(OwnerFactInvalid) as single:
        owner_readers.credential_generation_read(generation_id=first)
    assert str(batched.value) == str(single.value)
    assert first in str(batched.value)


def test_secret_listing_decides_only_what_a_stat_would(tmp_path):
    """`versions_present` answers present/absent exactly where `version_exists` would, and leaves to
    `version_exists` what a listing cannot decide: non-canonical references, a symbolic link, an unavailable
    root. Proves: CV2-02-021"""
    backend = FileSecretBackend(tmp_path)
    present = backend.put("crm-api", b"s1")
    absent = "crm-api/v9"
    in_missing_dir = "other-identity/v1"
    (tmp_path / "crm-api" / "v5").symlink_to(tmp_path / "nowhere")
    linked = "crm-api/v5"
    answers = backend.versions_present([present, absent, in_missing_dir, linked, "../etc/v1", "bad ref"])
    assert answers == {present: True, absent: False, in_missing_dir: False}
    for ref, exists in answers.items():
        assert backend.version_exists(ref) is exists
    assert backend.version_exists(linked) is False  # the dangling link: decided by stat, not by the listing
    assert FileSecretBackend(tmp_path / "unmounted").versions_present([present]) == {}


def test_a_catalog_row_alone_is_not_definition_proof(owners_world):
    """The Catalog binding row stays as published, but its binding definition is gone from the definition owner
    (moved to another key behind the owner's back): the row's identity and authorization do not stand in for
    the definition, so verification rejects. Proves: CV2-02-009"""
    epoch = serving.epoch_prepare(candidate=_candidate(owners_world), actor=ACTOR)
    with connection.cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE connector_bindingdefinition SET business_key = business_key || '.moved' "
                       "WHERE kind = 'field_mapping'")
        cursor.execute("SET session_replication_role = origin")
        dbroles.admin_off(cursor)
    assert owners_world.view.bindings.filter(kind="field_mapping").exists()
    epoch = serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert (epoch.state, epoch.rejection_code) == (EpochState.REJECTED, "OWNER_FACT_INVALID")
    assert "is absent from" in epoch.rejection_detail
