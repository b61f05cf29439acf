"""Owner generations and epoch facts are immutable in the database itself; referenced generations cannot be
deleted; identities are validated before anything is written."""
from __future__ import annotations

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction

from connector.actors import Actor
from connector.errors import IdentityInvalid, OwnerFactInvalid
from connector.models import (
    AuditRecord,
    BindingDefinition,
    CatalogBinding,
    ConnectorAccount,
    CredentialGeneration,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServiceConfigurationGeneration,
    ServingEpoch,
    ServingEpochBindingProof,
    ServingEpochCredentialProof,
)
from connector.services import owners
from tests import dbroles

ACTOR = Actor.system("test")

IMMUTABLE = [PackGeneration, BindingDefinition, IntegrationBindingView, CatalogBinding, CredentialGeneration,
             ServiceConfigurationGeneration, ServiceConfigurationAccount, ServiceConfigurationCredentialMapping,
             ServingEpochBindingProof, ServingEpochCredentialProof]


def _raw(sql, params=()):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


@pytest.mark.django_db
@pytest.mark.parametrize("model", IMMUTABLE, ids=lambda m: m.__name__)
def test_owner_generation_rows_cannot_be_updated(world, model):
    """Even raw SQL cannot update an immutable fact: the application role holds no UPDATE privilege on it, and
    the row trigger refuses even the administrator (issue 17: two lines). Proves: CV2-02-013, CV2-02-044,
    CV2-01-015"""
    row = model.objects.first()
    with pytest.raises(ProgrammingError, match="permission denied"):
        _raw(f"UPDATE {model._meta.db_table} SET id = id WHERE id = %s", [row.pk])
    with dbroles.as_admin(), pytest.raises(IntegrityError) as info:
        _raw(f"UPDATE {model._meta.db_table} SET id = id WHERE id = %s", [row.pk])
    assert info.value.__cause__.diag.constraint_name == f"{model._meta.db_table}_immutable"


@pytest.mark.django_db
@pytest.mark.parametrize("model", [PackGeneration, BindingDefinition, CredentialGeneration,
                                   ServiceConfigurationGeneration, IntegrationBindingView])
def test_generation_referenced_by_an_active_epoch_cannot_be_deleted(world, model):
    """Uninstall or retention cannot remove a generation an active epoch references: the foreign keys of the
    frozen proof rows refuse the delete at commit, whatever path issues it. Proves: CV2-02-013, CV2-02-044,
    CV2-02-022"""
    row = model.objects.first()
    with pytest.raises(ProgrammingError, match="permission denied"):  # the application role deletes no owner row
        _raw(f"DELETE FROM {model._meta.db_table} WHERE id = %s", [row.pk])
    with dbroles.as_admin(), pytest.raises(IntegrityError):
        # foreign keys are checked at commit; IMMEDIATE checks them now, inside the test's transaction
        _raw(f"SET CONSTRAINTS ALL IMMEDIATE; DELETE FROM {model._meta.db_table} WHERE id = %s", [row.pk])
    assert model.objects.filter(pk=row.pk).exists()


@pytest.mark.django_db
def test_epoch_frozen_columns_cannot_change(world):
    """Only the state columns of a ServingEpoch change; its preimage and digest are immutable. The two large
    columns have their own trigger (`BEFORE UPDATE OF`, D-289): naming one with its own value passes, changing it
    is refused with the same constraint, alone or next to a state change.
    Proves: CV2-01-015, CV2-02-023"""
    epoch = world.active_epoch
    _raw("UPDATE connector_servingepoch SET preimage = preimage, configuration_receipt = configuration_receipt "
         "WHERE id=%s", [epoch.pk])
    for sql in ("UPDATE connector_servingepoch SET preimage = '\\x00'::bytea WHERE id=%s",
                "UPDATE connector_servingepoch SET configuration_receipt = '\\x00'::bytea WHERE id=%s",
                "UPDATE connector_servingepoch SET state = 'draining', preimage = preimage || '\\x00'::bytea "
                "WHERE id=%s",
                "UPDATE connector_servingepoch SET digest = '\\x00'::bytea WHERE id=%s",
                "UPDATE connector_servingepoch SET profile_id = 'nexuscrm.connector-digest-profile.v1' WHERE id=%s"):
        with pytest.raises(IntegrityError) as info:
            _raw(sql, [epoch.pk])
        assert info.value.__cause__.diag.constraint_name == "connector_servingepoch_immutable_columns"


@pytest.mark.django_db
def test_audit_is_append_only(world):
    """Audit rows are never updated or deleted: not by the application role (no privilege), not by the
    administrator (the row trigger). Proves: CV2-02-006; issue 17 item 3"""
    row = AuditRecord.objects.first()
    for sql in ("UPDATE connector_auditrecord SET reason='x' WHERE id=%s", "DELETE FROM connector_auditrecord WHERE id=%s"):
        with pytest.raises(ProgrammingError, match="permission denied"):
            _raw(sql, [row.pk])
        with dbroles.as_admin(), pytest.raises(IntegrityError) as info:
            _raw(sql, [row.pk])
        assert info.value.__cause__.diag.constraint_name == "connector_auditrecord_append_only"


@pytest.mark.django_db
@pytest.mark.parametrize("key", [" acme", "acme ", "", None, "ac\u200bme ", b"\xffacme", "e\u0301"])
def test_noncanonical_account_key_is_refused_and_nothing_is_written(key):
    """Identity validation happens before persistence; the service never trims. Proves: CV2-01-003,
    CV2-01-004, CV2-01-005, CV2-01-029"""
    audit_rows = AuditRecord.objects.count()  # the roles' own audit (their permissions, synced at migrate)
    with pytest.raises(IdentityInvalid):
        owners.account_create(account_key=key, provider_scope="p", actor=ACTOR)
    assert ConnectorAccount.objects.count() == 0
    assert AuditRecord.objects.count() == audit_rows


@pytest.mark.django_db
def test_identity_lookup_is_byte_exact(world):
    """A lookup with a padded or case-folded key finds nothing: no query-time TRIM or folding.
    Proves: CV2-01-005"""
    key = world.accounts[0].account_key
    assert ConnectorAccount.objects.filter(account_key=key).exists()
    for variant in (key.upper(), f" {key}", f"{key} "):
        assert not ConnectorAccount.objects.filter(account_key=variant).exists()


@pytest.mark.django_db
def test_rotation_mints_a_new_generation_never_edits(world):
    """Re-creating an existing generation ID is refused; rotation mints a new generation with a new secret
    version reference, and the old one is untouched. Proves: CV2-02-018, CV2-02-019"""
    old = CredentialGeneration.objects.order_by("generation_id").first()
    with pytest.raises(OwnerFactInvalid):
        owners.credential_generation_create(generation_id=old.generation_id, credential_identity=old.credential_identity,
                                            account_key=old.account.account_key, secret=b"new", transport_config={},
                                            actor=ACTOR)
    new = owners.credential_generation_create(generation_id=old.generation_id + ".rotated",
                                              credential_identity=old.credential_identity,
                                              account_key=old.account.account_key, secret=b"new",
                                              transport_config={}, actor=ACTOR)
    assert new.secret_version_ref != old.secret_version_ref
    assert new.dispatch_gate.mode == "enabled"
    old.refresh_from_db()
    assert CredentialGeneration.objects.get(pk=old.pk).secret_version_ref == old.secret_version_ref


@pytest.mark.django_db
def test_unknown_binding_kind_is_refused():
    """Binding kinds are closed. Proves: CV2-02-011"""
    with pytest.raises(OwnerFactInvalid):
        owners.pack_generation_install(generation_id="p.g1", owner_pack="p", pack_installation_id="i",
                                       definitions=[{"kind": "webhook_secret", "business_key": "x", "version": 1,
                                                     "definition": {}}], actor=ACTOR)
    assert PackGeneration.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize("kind,definition", [
    ("inbound_route", {"extract": {}}),
    ("inbound_route", {"ordering_contract": "arrival_order", "extract": {}}),
    ("callout_profile", {"method": "POST"}),
    ("field_mapping", {}),
    ("push_contract", {"effect_definition": "x"}),
])
def test_binding_definition_owner_validates_each_kind(kind, definition):
    """Each kind's owner reader validates its definition under its own rules; an invalid one is never
    installed. Proves: CV2-02-010, CV2-02-011"""
    with pytest.raises(OwnerFactInvalid):
        owners.pack_generation_install(generation_id="p.g1", owner_pack="p", pack_installation_id="i",
                                       definitions=[{"kind": kind, "business_key": "x", "version": 1,
                                                     "definition": definition}], actor=ACTOR)
    assert PackGeneration.objects.count() == 0 and BindingDefinition.objects.count() == 0


@pytest.mark.django_db
def test_epoch_never_copies_definitions_or_secrets(world):
    """ServingEpoch keeps owner identities, digests and receipts, never definition payloads or configuration
    payload bytes. Proves: CV2-01-024, CV2-02-027"""
    epoch = world.active_epoch
    preimage = bytes(epoch.preimage)
    for definition in BindingDefinition.objects.all():
        assert bytes(definition.definition) not in preimage
    assert bytes(world.configuration.payload) not in preimage
    assert bytes(world.configuration.receipt) in preimage  # the owner's exact receipt bytes, opaque
    assert ServingEpoch._meta.get_field("preimage") and not hasattr(epoch, "definition")
