"""Authoring of owner generations. Each creates immutable rows with the owner's receipt in one transaction;
there is no update path. (In production these owners are external; here they are local owners with the same
exact-generation contract, so the product runs end to end.)"""
from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from connector import hooks, locks, receipts
from connector.actors import Actor
from connector.canonical.identity import IdentityRejected, canonical_identity
from connector.choices import BindingKind
from connector.errors import IdentityInvalid, OwnerFactInvalid
from connector.models import (
    AccountServingGate,
    BindingDefinition,
    CatalogBinding,
    ConnectorAccount,
    CredentialGeneration,
    CredentialGenerationDispatchGate,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServiceConfigurationGeneration,
)
from connector.secrets import secret_backend
from connector.selectors import owners as owner_readers
from connector.services.audit import audit_record

GENERATION_PROTOCOL = "nexuscrm.service-configuration.generation.v1"


def ident(value: Any, field: str) -> str:
    """Canonical identity or a clear rejection before anything is written (CV2-01-003/004)."""
    try:
        return canonical_identity(value, field=field)
    except IdentityRejected as exc:
        raise IdentityInvalid(str(exc) if exc.code in str(exc) else f"{field}: {exc.code}: {exc}", field=field,
                              reason=exc.code) from exc


def _kind(value: Any) -> str:
    if value not in BindingKind.values:
        raise OwnerFactInvalid(f"binding kind {value!r} is not one of the four closed kinds")
    return str(BindingKind(value).value)


def _owner_barrier(owner: str) -> None:
    """The first statement of every owner write (the inventory in docs/locking.md, "Owner barriers"; D-284): hold
    the owner's publication barrier shared until this transaction ends, then let the cutover app refuse the write
    while a publication barrier set holds it (PUBLICATION_BARRIER_HELD)."""
    locks.owner_barriers_lock([owner], exclusive=False)
    hooks.publication_guard(owner)


def _unique(fn):
    def inner(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except IntegrityError as exc:
            name = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
            raise OwnerFactInvalid(f"{fn.__name__} refused by constraint {name}: generations are immutable and "
                                   f"unique; author a new generation") from exc
    inner.__name__ = fn.__name__
    inner.__doc__ = fn.__doc__
    return inner


@_unique
@transaction.atomic
def account_create(*, account_key: str, provider_scope: str, display_name: str = "",
                   actor: Actor) -> ConnectorAccount:
    """Create an account and its AccountServingGate (`v1_serving`, fence 1): an L2 authoring write, under the
    configuration owner's barrier."""
    _owner_barrier("configuration")
    account = ConnectorAccount.objects.create(account_key=ident(account_key, "account_key"),
                                              provider_scope=ident(provider_scope, "provider_scope"),
                                              display_name=display_name)
    gate = AccountServingGate.objects.create(account=account)
    audit_record(actor=actor, entity=gate, action="gate_create", to_state=gate.mode, fence=gate.fence)
    return account


@_unique
@transaction.atomic
def pack_generation_install(*, generation_id: str, owner_pack: str, pack_installation_id: str,
                            definitions: list[dict[str, Any]], envelope_version: int = 1, receipt_version: int = 1,
                            actor: Actor) -> PackGeneration:
    """Install one immutable pack generation and its binding definitions (the binding-definition owner).
    `definitions`: [{kind, business_key, version, definition}] with definition a JSON object."""
    _owner_barrier("binding_definitions")
    generation_id = ident(generation_id, "generation_id")
    owner_pack = ident(owner_pack, "owner_pack")
    pack_installation_id = ident(pack_installation_id, "pack_installation_id")
    definitions = [{**d, "kind": _kind(d["kind"])} for d in definitions]
    document = {"owner_pack": owner_pack, "definitions": [
        {"kind": d["kind"], "business_key": d["business_key"], "version": d["version"],
         "definition": d["definition"]} for d in definitions]}
    payload = receipts.canonical_json(document)
    payload_digest = receipts.sha256(payload)
    receipt, receipt_digest = receipts.pack_receipt(
        generation_id=generation_id, owner_pack=owner_pack, pack_installation_id=pack_installation_id,
        envelope_version=envelope_version, receipt_version=receipt_version, payload_digest=payload_digest)
    pack = PackGeneration.objects.create(
        generation_id=generation_id, owner_pack=owner_pack, pack_installation_id=pack_installation_id,
        definition_envelope_version=envelope_version, definition_receipt_version=receipt_version,
        payload=payload, payload_digest=payload_digest, receipt=receipt, receipt_digest=receipt_digest)
    for d in definitions:
        business_key = ident(d["business_key"], "business_key")
        body = receipts.canonical_json(d["definition"])
        digest = receipts.definition_digest(kind=d["kind"], business_key=business_key,
                                            definition_version=d["version"], definition=body)
        d_receipt, d_receipt_digest = receipts.definition_receipt(
            pack_generation_id=generation_id, kind=d["kind"], business_key=business_key,
            definition_version=d["version"], canonical_definition_digest=digest)
        BindingDefinition.objects.create(
            pack_generation=pack, kind=d["kind"], business_key=business_key, definition_version=d["version"],
            definition=body, canonical_definition_digest=digest, receipt=d_receipt, receipt_digest=d_receipt_digest)
    for d in definitions:  # the owner's own validation of what it just wrote
        owner_readers.binding_definition_read(kind=d["kind"], pack_generation_id=generation_id,
                                              pack_payload_digest=payload_digest, business_key=d["business_key"],
                                              definition_version=d["version"])
    audit_record(actor=actor, entity=pack, action="pack_generation_install", evidence_digest=receipt_digest)
    return pack


@_unique
@transaction.atomic
def catalog_view_publish(*, view_key: str, organization: str, application_installation: str,
                         authorized_workload: str, lineage_revision: str, source_snapshot_digest: bytes,
                         security_epoch: int, capability_version: str, bindings: list[dict[str, Any]],
                         receipt_protocol: str = receipts.CATALOG_RECEIPT_PROTOCOL,
                         actor: Actor) -> IntegrationBindingView:
    """Publish the next revision of a Catalog view with its ordered bindings. `bindings`: [{kind,
    pack_generation_id, business_key, definition_version, credential_refs, runtime: (id, version) | None}]."""
    _owner_barrier("catalog")
    view_key = ident(view_key, "view_key")
    last = IntegrationBindingView.objects.filter(view_key=view_key).order_by("-revision").first()
    revision = 1 if last is None else last.revision + 1
    rows = []
    bindings = [{**b, "kind": _kind(b["kind"])} for b in bindings]
    for ordinal, b in enumerate(bindings):
        pack = PackGeneration.objects.filter(generation_id=b["pack_generation_id"]).first()
        if pack is None:
            raise OwnerFactInvalid(f"binding #{ordinal} names absent pack generation {b['pack_generation_id']}")
        refs = [ident(r, "credential_ref") for r in b.get("credential_refs", [])]
        if len(set(refs)) != len(refs):
            raise OwnerFactInvalid(f"binding #{ordinal} repeats a CredentialRef")
        runtime = b.get("runtime")
        owner_readers.binding_definition_read(kind=b["kind"], pack_generation_id=pack.generation_id,
                                              pack_payload_digest=bytes(pack.payload_digest),
                                              business_key=b["business_key"],
                                              definition_version=b["definition_version"])
        identity = receipts.catalog_binding_identity(
            view_key=view_key, kind=b["kind"], owner_pack=pack.owner_pack,
            pack_installation_id=pack.pack_installation_id, pack_payload_digest=bytes(pack.payload_digest),
            business_key=b["business_key"], definition_version=b["definition_version"], credential_refs=refs,
            runtime=tuple(runtime) if runtime else None)
        rows.append(dict(ordinal=ordinal, row_id=identity[:16].hex(), identity_digest=identity, kind=b["kind"],
                         owner_pack=pack.owner_pack, pack_generation=pack,
                         pack_installation_id=pack.pack_installation_id,
                         pack_payload_digest=bytes(pack.payload_digest), business_key=b["business_key"],
                         definition_version=b["definition_version"], credential_refs=refs,
                         runtime_command_definition_id=runtime[0] if runtime else None,
                         runtime_command_version=runtime[1] if runtime else None))
    view_digest = receipts.catalog_view_digest(
        view_key=view_key, revision=revision, organization=ident(organization, "organization"),
        application_installation=ident(application_installation, "application_installation"),
        authorized_workload=ident(authorized_workload, "authorized_workload"),
        lineage_revision=ident(lineage_revision, "lineage_revision"),
        source_snapshot_digest=source_snapshot_digest, binding_identity_digests=[r["identity_digest"] for r in rows])
    receipt, receipt_digest = receipts.catalog_receipt(
        view_key=view_key, revision=revision, view_digest=view_digest, receipt_protocol=receipt_protocol,
        security_epoch=security_epoch, capability_version=capability_version)
    view = IntegrationBindingView.objects.create(
        view_key=view_key, revision=revision, organization=organization,
        application_installation=application_installation, authorized_workload=authorized_workload,
        lineage_revision=lineage_revision, source_snapshot_digest=source_snapshot_digest, view_digest=view_digest,
        receipt_protocol=receipt_protocol, security_epoch=security_epoch, capability_version=capability_version,
        receipt=receipt, receipt_digest=receipt_digest)
    CatalogBinding.objects.bulk_create([CatalogBinding(view=view, **r) for r in rows])
    audit_record(actor=actor, entity=view, action="catalog_view_publish", evidence_digest=receipt_digest)
    return view


@_unique
@transaction.atomic
def credential_generation_create(*, generation_id: str, credential_identity: str, account_key: str, secret: bytes,
                                 transport_config: dict[str, Any], actor: Actor) -> CredentialGeneration:
    """Mint an immutable CredentialGeneration: the secret goes to the secret backend (never PostgreSQL), the row
    keeps its immutable version reference; its dispatch gate is created `enabled` in the same transaction
    (decision 15)."""
    _owner_barrier("credential_authority")
    generation_id = ident(generation_id, "generation_id")
    credential_identity = ident(credential_identity, "credential_identity")
    account = ConnectorAccount.objects.filter(account_key=account_key).first()
    if account is None:
        raise OwnerFactInvalid(f"account {account_key!r} is absent")
    if CredentialGeneration.objects.filter(generation_id=generation_id).exists():
        raise OwnerFactInvalid(f"credential generation {generation_id} exists; rotation mints a new generation")
    secret_ref = secret_backend().put(credential_identity, secret)
    transport_digest = receipts.transport_config_digest(transport_config)
    receipt, receipt_digest = receipts.credential_receipt(
        generation_id=generation_id, credential_identity=credential_identity, provider_scope=account.provider_scope,
        account_key=account.account_key, secret_version_ref=secret_ref, transport_config_digest=transport_digest)
    generation = CredentialGeneration.objects.create(
        generation_id=generation_id, credential_identity=credential_identity, provider_scope=account.provider_scope,
        account=account, secret_version_ref=secret_ref, transport_config_digest=transport_digest,
        receipt_protocol=receipts.CREDENTIAL_RECEIPT_PROTOCOL, receipt=receipt, receipt_digest=receipt_digest)
    gate = CredentialGenerationDispatchGate.objects.create(credential_generation=generation)
    audit_record(actor=actor, entity=generation, action="credential_generation_create",
                 evidence_digest=receipt_digest)
    audit_record(actor=actor, entity=gate, action="credential_gate_create", to_state=gate.mode, fence=gate.fence)
    return generation


@_unique
@transaction.atomic
def service_configuration_create(*, generation_id: str, catalog_view_key: str, catalog_revision: int,
                                 accounts: list[dict[str, Any]], credential_relation: list[tuple[str, str, str]],
                                 actor: Actor) -> ServiceConfigurationGeneration:
    """Author one immutable L2 configuration generation over an exact Catalog view revision. `accounts` in
    canonical order: [{account_key, enabled_routes, mapping_selections, policy_values}];
    `credential_relation`: the exhaustive [(account_key, credential_ref, credential_generation_id)]. Missing,
    extra or duplicate mappings and scope mismatches are refused (CV2-02-016)."""
    _owner_barrier("configuration")
    generation_id = ident(generation_id, "generation_id")
    catalog = owner_readers.catalog_view_read_exact(view_key=catalog_view_key, revision=catalog_revision)
    account_rows = []
    for a in accounts:
        row = ConnectorAccount.objects.filter(account_key=a["account_key"]).first()
        if row is None:
            raise OwnerFactInvalid(f"account {a['account_key']!r} is absent")
        unknown = [r for r in a.get("enabled_routes", []) if r not in catalog.route_keys()]
        if unknown:
            raise OwnerFactInvalid(f"account {row.account_key} enables routes not in the Catalog view: {unknown}")
        account_rows.append((row, a))
    if len({r.pk for r, _ in account_rows}) != len(account_rows):
        raise OwnerFactInvalid("the account set repeats an account")
    relation = [(ident(a, "account_key"), ident(r, "credential_ref"), ident(g, "credential_generation_id"))
                for a, r, g in credential_relation]
    generations = {g.generation_id: g for g in CredentialGeneration.objects.select_related("account").filter(
        generation_id__in=[g for _, _, g in relation])}
    owner_readers.check_credential_relation(
        accounts=[(r.account_key, r.provider_scope) for r, _ in account_rows], required_refs=catalog.credential_refs(),
        relation=relation, generations={k: (g.credential_identity, g.account.account_key, g.provider_scope)
                                        for k, g in generations.items()})
    account_dicts = [{"account_key": r.account_key, "provider_scope": r.provider_scope,
                      "enabled_routes": list(a.get("enabled_routes", [])),
                      "mapping_selections": a.get("mapping_selections", {}),
                      "policy_values": a.get("policy_values", {})} for r, a in account_rows]
    payload = receipts.configuration_payload(generation_id=generation_id, catalog_view_key=catalog.view_key,
                                             catalog_revision=catalog.revision, accounts=account_dicts,
                                             relation=relation)
    digest = receipts.sha256(payload)
    receipt, receipt_digest = receipts.configuration_receipt(generation_protocol=GENERATION_PROTOCOL,
                                                             generation_id=generation_id, generation_digest=digest)
    config = ServiceConfigurationGeneration.objects.create(
        generation_id=generation_id, generation_protocol=GENERATION_PROTOCOL,
        receipt_protocol=receipts.CONFIGURATION_RECEIPT_PROTOCOL, catalog_view_id=catalog.pk, payload=payload,
        generation_digest=digest, receipt=receipt, receipt_digest=receipt_digest)
    ServiceConfigurationAccount.objects.bulk_create([
        ServiceConfigurationAccount(generation=config, ordinal=i, account=row, enabled_routes=d["enabled_routes"],
                                    mapping_selections=d["mapping_selections"], policy_values=d["policy_values"])
        for i, ((row, _), d) in enumerate(zip(account_rows, account_dicts))])
    accounts_by_key = {r.account_key: r for r, _ in account_rows}
    ServiceConfigurationCredentialMapping.objects.bulk_create([
        ServiceConfigurationCredentialMapping(generation=config, account=accounts_by_key[a], credential_ref=r,
                                              credential_generation=generations[g]) for a, r, g in relation])
    owner_readers.service_configuration_read(generation_id=generation_id)  # the owner's reader accepts it
    audit_record(actor=actor, entity=config, action="service_configuration_create", evidence_digest=receipt_digest)
    return config
