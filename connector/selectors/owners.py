"""Exact-generation owner readers: the sole read path of every owner fact (CV2-02-001, CV2-02-010).

Each reader loads one exact generation, recomputes the owner's digests and receipt from the stored bytes under
the owner's protocol and byte-compares them with what the owner recorded at authoring, validates the fact under
its owner's rules, and returns an immutable value. Authoritative absence, mutation or mismatch raises
`OwnerFactInvalid`; a transient failure to read raises `OwnerUnavailable` (retryable).
"""
from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import wraps
from typing import NamedTuple

from django.db import DatabaseError, OperationalError, connection

from connector import receipts
from connector.canonical.encoding import Encoded
from connector.canonical.shapes import text_list
from connector.choices import BindingKind
from connector.errors import CredentialMappingInvalid, OwnerFactInvalid, OwnerUnavailable
from connector.interpreters import callout, ordering_proof
from connector.models import (
    BindingDefinition,
    CatalogBinding,
    CredentialGeneration,
    IntegrationBindingView,
    PackGeneration,
    ServiceConfigurationAccount,
    ServiceConfigurationCredentialMapping,
    ServiceConfigurationGeneration,
)
from connector.secrets import secret_backend


def _same(a: bytes | memoryview | None, b: bytes | memoryview | None) -> bool:
    if a is None or b is None:
        return a is b
    return hmac.compare_digest(bytes(a), bytes(b))


def _retryable(fn):
    """A database that cannot answer now is retryable unavailability, not authoritative absence."""

    @wraps(fn)
    def inner(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            raise OwnerUnavailable(f"{fn.__name__}: owner store unavailable: {exc}") from exc
        except DatabaseError as exc:  # pragma: no cover - other driver failures are retryable too
            raise OwnerUnavailable(f"{fn.__name__}: {exc}") from exc

    return inner


# -- binding-definition owners, one reader per closed kind ---------------------------------------------------

_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    BindingKind.INBOUND_ROUTE: ("ordering_contract", "extract"),
    BindingKind.CALLOUT_PROFILE: ("method", "path_template"),
    BindingKind.FIELD_MAPPING: ("fields",),
    BindingKind.PUSH_CONTRACT: ("effect_definition", "effect_version"),
}
ORDERING_CONTRACTS = ("order_independent", "latest_source_position", "strict_source_sequence")


@dataclass(frozen=True)
class DefinitionProof:
    pack_generation_pk: int
    pack_generation_id: str
    definition_envelope_version: int
    definition_receipt_version: int
    canonical_definition_digest: bytes
    owner_receipt: bytes
    owner_receipt_digest: bytes
    definition: bytes


def _validate_definition(kind: str, definition: bytes) -> None:
    try:
        document = json.loads(definition)
    except ValueError as exc:
        raise OwnerFactInvalid(f"{kind} definition is not JSON") from exc
    if not isinstance(document, dict):
        raise OwnerFactInvalid(f"{kind} definition must be an object")
    missing = [key for key in _REQUIRED_KEYS[kind] if key not in document]
    if missing:
        raise OwnerFactInvalid(f"{kind} definition lacks {', '.join(missing)}")
    if kind == BindingKind.INBOUND_ROUTE and document["ordering_contract"] not in ORDERING_CONTRACTS:
        raise OwnerFactInvalid(f"inbound route ordering contract {document['ordering_contract']!r} is not closed")
    if kind == BindingKind.INBOUND_ROUTE and document["ordering_contract"] == "order_independent":
        ordering_proof.check_order_independence(document)  # OrderIndependenceUnproven (an OwnerFactInvalid)
    if kind == BindingKind.CALLOUT_PROFILE:
        callout.parse_template(document["path_template"])  # CalloutTemplateInvalid (an OwnerFactInvalid)
        update = document.get("update")  # the variant addressing a linked remote identity (D-190)
        if update is not None:
            if not isinstance(update, dict) or "method" not in update or "path_template" not in update:
                raise OwnerFactInvalid("callout_profile update variant needs method and path_template")
            callout.parse_template(update["path_template"])
    if receipts.canonical_json(document) != bytes(definition):
        raise OwnerFactInvalid(f"{kind} definition bytes are not canonical")


@_retryable
def binding_definition_read(*, kind: str, pack_generation_id: str, pack_payload_digest: bytes, business_key: str,
                            definition_version: int) -> DefinitionProof:
    """The kind-specific owner reader, keyed by the complete Catalog binding identity and payload digest."""
    if kind not in BindingKind.values:
        raise OwnerFactInvalid(f"binding kind {kind!r} is not one of the four closed kinds")
    pack = PackGeneration.objects.filter(generation_id=pack_generation_id).first()
    if pack is None:
        raise OwnerFactInvalid(f"pack generation {pack_generation_id} is absent")
    if not _same(receipts.sha256(bytes(pack.payload)), pack.payload_digest) or not _same(
            pack.payload_digest, pack_payload_digest):
        raise OwnerFactInvalid(f"pack generation {pack_generation_id} payload digest mismatch")
    receipt, receipt_digest = receipts.pack_receipt(
        generation_id=pack.generation_id, owner_pack=pack.owner_pack, pack_installation_id=pack.pack_installation_id,
        envelope_version=pack.definition_envelope_version, receipt_version=pack.definition_receipt_version,
        payload_digest=bytes(pack.payload_digest))
    if not (_same(receipt, pack.receipt) and _same(receipt_digest, pack.receipt_digest)):
        raise OwnerFactInvalid(f"pack generation {pack_generation_id} receipt mismatch")
    definition = BindingDefinition.objects.filter(pack_generation=pack, kind=kind, business_key=business_key,
                                                  definition_version=definition_version).first()
    if definition is None:
        raise OwnerFactInvalid(f"{kind} {business_key} v{definition_version} is absent from {pack_generation_id}")
    body = bytes(definition.definition)
    _validate_definition(kind, body)
    digest = receipts.definition_digest(kind=kind, business_key=business_key, definition_version=definition_version,
                                        definition=body)
    d_receipt, d_receipt_digest = receipts.definition_receipt(
        pack_generation_id=pack.generation_id, kind=kind, business_key=business_key,
        definition_version=definition_version, canonical_definition_digest=digest)
    if not (_same(digest, definition.canonical_definition_digest) and _same(d_receipt, definition.receipt)
            and _same(d_receipt_digest, definition.receipt_digest)):
        raise OwnerFactInvalid(f"{kind} {business_key} v{definition_version} digest or receipt mismatch")
    return DefinitionProof(pack.pk, pack.generation_id, pack.definition_envelope_version,
                           pack.definition_receipt_version, digest, d_receipt, d_receipt_digest, body)


# -- Catalog -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BindingFact:
    pk: int
    ordinal: int
    row_id: str
    identity_digest: bytes
    kind: str
    owner_pack: str
    pack_generation_id: str
    pack_installation_id: str
    pack_payload_digest: bytes
    business_key: str
    definition_version: int
    credential_refs: tuple[str, ...]
    runtime: tuple[str, int] | None


@dataclass(frozen=True)
class CatalogFact:
    pk: int
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
    receipt: bytes
    receipt_digest: bytes
    bindings: tuple[BindingFact, ...]

    def credential_refs(self) -> tuple[str, ...]:
        return tuple(sorted({ref for b in self.bindings for ref in b.credential_refs}))

    def route_keys(self) -> tuple[str, ...]:
        return tuple(b.business_key for b in self.bindings if b.kind == BindingKind.INBOUND_ROUTE)


def _catalog_fact(view: IntegrationBindingView) -> CatalogFact:
    facts = []
    rows = list(CatalogBinding.objects.filter(view=view).select_related("pack_generation").order_by("ordinal"))
    for expected, row in enumerate(rows):
        if row.ordinal != expected:
            raise OwnerFactInvalid(f"catalog view {view} binding ordinals are not dense")
        runtime = None if row.runtime_command_definition_id is None else (
            row.runtime_command_definition_id, row.runtime_command_version)
        identity = receipts.catalog_binding_identity(
            view_key=view.view_key, kind=row.kind, owner_pack=row.owner_pack,
            pack_installation_id=row.pack_installation_id, pack_payload_digest=bytes(row.pack_payload_digest),
            business_key=row.business_key, definition_version=row.definition_version,
            credential_refs=list(row.credential_refs), runtime=runtime)
        if not _same(identity, row.identity_digest) or row.row_id != identity[:16].hex():
            raise OwnerFactInvalid(f"catalog binding {row} identity mismatch")
        if row.pack_generation.owner_pack != row.owner_pack or not _same(
                row.pack_generation.payload_digest, row.pack_payload_digest):
            raise OwnerFactInvalid(f"catalog binding {row} names a different pack generation")
        facts.append(BindingFact(row.pk, row.ordinal, row.row_id, identity, row.kind, row.owner_pack,
                                 row.pack_generation.generation_id, row.pack_installation_id,
                                 bytes(row.pack_payload_digest), row.business_key, row.definition_version,
                                 tuple(row.credential_refs), runtime))
    view_digest = receipts.catalog_view_digest(
        view_key=view.view_key, revision=view.revision, organization=view.organization,
        application_installation=view.application_installation, authorized_workload=view.authorized_workload,
        lineage_revision=view.lineage_revision, source_snapshot_digest=bytes(view.source_snapshot_digest),
        binding_identity_digests=[f.identity_digest for f in facts])
    receipt, receipt_digest = receipts.catalog_receipt(
        view_key=view.view_key, revision=view.revision, view_digest=view_digest,
        receipt_protocol=view.receipt_protocol, security_epoch=view.security_epoch,
        capability_version=view.capability_version)
    if not (_same(view_digest, view.view_digest) and _same(receipt, view.receipt)
            and _same(receipt_digest, view.receipt_digest)):
        raise OwnerFactInvalid(f"catalog view {view} digest or receipt mismatch")
    return CatalogFact(view.pk, view.view_key, view.revision, view.organization, view.application_installation,
                       view.authorized_workload, view.lineage_revision, bytes(view.source_snapshot_digest),
                       view_digest, view.receipt_protocol, view.security_epoch, view.capability_version, receipt,
                       receipt_digest, tuple(facts))


@_retryable
def catalog_view_read_current(*, view_key: str) -> CatalogFact:
    """The complete current view of a lineage (its highest revision)."""
    view = IntegrationBindingView.objects.filter(view_key=view_key).order_by("-revision").first()
    if view is None:
        raise OwnerFactInvalid(f"catalog view {view_key} is absent")
    return _catalog_fact(view)


@_retryable
def catalog_view_read_exact(*, view_key: str, revision: int) -> CatalogFact:
    view = IntegrationBindingView.objects.filter(view_key=view_key, revision=revision).first()
    if view is None:
        raise OwnerFactInvalid(f"catalog view {view_key} r{revision} is absent")
    return _catalog_fact(view)


# -- credential generations ----------------------------------------------------------------------------------

class CredentialFact(NamedTuple):
    """Immutable; a tuple (built once per credential generation by every reread: a frozen dataclass cost three
    times as much to build, issue 19, D-272)."""

    pk: int
    generation_id: str
    credential_identity: str
    provider_scope: str
    account_key: str
    secret_version_ref: str
    transport_config_digest: bytes
    receipt_protocol: str
    receipt: bytes
    receipt_digest: bytes


@_retryable
def credential_generation_read(*, generation_id: str) -> CredentialFact:
    """Exact generation metadata; checks the secret version exists without reading secret bytes."""
    row = CredentialGeneration.objects.select_related("account").filter(generation_id=generation_id).first()
    if row is None:
        raise OwnerFactInvalid(f"credential generation {generation_id} is absent")
    receipt, receipt_digest = receipts.credential_receipt(
        generation_id=row.generation_id, credential_identity=row.credential_identity,
        provider_scope=row.provider_scope, account_key=row.account.account_key,
        secret_version_ref=row.secret_version_ref, transport_config_digest=bytes(row.transport_config_digest))
    if row.receipt_protocol != receipts.CREDENTIAL_RECEIPT_PROTOCOL or not (
            _same(receipt, row.receipt) and _same(receipt_digest, row.receipt_digest)):
        raise OwnerFactInvalid(f"credential generation {generation_id} receipt mismatch")
    if not secret_backend().version_exists(row.secret_version_ref):
        raise OwnerFactInvalid(f"credential generation {generation_id}: secret version "
                               f"{row.secret_version_ref} is absent from the secret backend")
    return CredentialFact(row.pk, row.generation_id, row.credential_identity, row.provider_scope,
                          row.account.account_key, row.secret_version_ref, bytes(row.transport_config_digest),
                          row.receipt_protocol, receipt, receipt_digest)


# Every credential generation of an id list with its account key, in ONE statement whatever the number of ids
# (an array parameter, not one placeholder per id: PostgreSQL's 65,535-parameter ceiling would otherwise bound
# the list). Only the columns the checks compare (STYLE R29). Issue 19 / D-207.
CREDENTIAL_GENERATIONS_SQL = """
SELECT g.id, g.generation_id, g.credential_identity, g.provider_scope, a.account_key, g.secret_version_ref,
       g.transport_config_digest, g.receipt_protocol, g.receipt, g.receipt_digest
  FROM connector_credentialgeneration AS g
  JOIN connector_connectoraccount AS a ON a.id = g.account_id
 WHERE g.generation_id = ANY(%s::text[])
"""


@_retryable
def credential_generations_read(*, generation_ids: Sequence[str],
                                rows: dict[str, tuple] | None = None) -> list[CredentialFact]:
    """credential_generation_read of every id, in the given order, with ONE query for all of them instead of one
    per generation (an epoch's reread names two per account; issue 19, D-207), and one secret-backend listing per
    credential identity instead of one stat per version (`versions_present`). Each generation gets exactly the
    checks credential_generation_read makes, in the same order (present, receipt recomputed and compared, receipt
    protocol, secret version present), and generations are checked in the given order, so the first failing
    generation raises the same OwnerFactInvalid (a version the listing cannot decide is asked of
    `version_exists`, which raises as before). `rows` (ConfigurationFact.credential_rows) are the same columns
    of the same generation rows, read fresh by the configuration's relation statement: then no second statement
    reads them again, and every check above is made on them all the same (D-272)."""
    assert (CredentialGeneration._meta.db_table, CredentialGeneration.account.field.related_model._meta.db_table) == (
        "connector_credentialgeneration", "connector_connectoraccount")
    ids = list(generation_ids)
    if rows is None:
        with connection.cursor() as cursor:
            cursor.execute(CREDENTIAL_GENERATIONS_SQL, [ids])
            rows = {row[1]: row for row in cursor.fetchall()}
    backend = secret_backend()
    present = backend.versions_present({row[5] for row in rows.values()})  # each distinct reference once
    facts = []
    for generation_id in ids:
        row = rows.get(generation_id)
        if row is None:
            raise OwnerFactInvalid(f"credential generation {generation_id} is absent")
        pk, _, identity, provider_scope, account_key, secret_ref, transport, protocol, stored, stored_digest = row
        transport = bytes(transport)
        receipt, receipt_digest = receipts.credential_receipt(
            generation_id=generation_id, credential_identity=identity, provider_scope=provider_scope,
            account_key=account_key, secret_version_ref=secret_ref, transport_config_digest=transport)
        if protocol != receipts.CREDENTIAL_RECEIPT_PROTOCOL or not (
                _same(receipt, stored) and _same(receipt_digest, stored_digest)):
            raise OwnerFactInvalid(f"credential generation {generation_id} receipt mismatch")
        exists = present.get(secret_ref)
        if exists is None:
            exists = backend.version_exists(secret_ref)
        if not exists:
            raise OwnerFactInvalid(f"credential generation {generation_id}: secret version "
                                   f"{secret_ref} is absent from the secret backend")
        facts.append(CredentialFact(pk, generation_id, identity, provider_scope, account_key, secret_ref, transport,
                                    protocol, receipt, receipt_digest))
    return facts


# -- L2 service configuration ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigurationFact:
    pk: int
    generation_id: str
    generation_protocol: str
    receipt_protocol: str
    catalog_view_key: str
    catalog_revision: int
    generation_digest: bytes
    receipt: bytes
    receipt_digest: bytes
    account_keys: tuple[str, ...]
    relation: tuple[tuple[str, str, str], ...]
    # Every related credential generation's row as the relation's statement read it, keyed by generation ID, in
    # CREDENTIAL_GENERATIONS_SQL's columns: for credential_generations_read(rows=...) (issue 19, D-272).
    credential_rows: dict[str, tuple] = field(default_factory=dict, repr=False, compare=False)

    def credential_generation_ids(self) -> tuple[str, ...]:
        return tuple(sorted({g for _, _, g in self.relation}, key=lambda g: g.encode("utf-8")))


def check_credential_relation(*, accounts: list[tuple[str, str]], required_refs: tuple[str, ...],
                              relation: list[tuple[str, str, str]],
                              generations: dict[str, tuple[str, str, str]]) -> None:
    """The exhaustive (account, CredentialRef) -> generation relation: every pair exactly once, nothing extra,
    each generation's stable identity and account/provider scope equal to the reference (CV2-02-016).
    `accounts` are (account_key, provider_scope); `generations` map id -> (identity, account_key, provider)."""
    providers = dict(accounts)
    refs = set(required_refs)
    seen: set[tuple[str, str]] = set()
    for account, ref, generation_id in relation:
        pair = (account, ref)
        if pair in seen:
            raise CredentialMappingInvalid(f"duplicate mapping for ({account}, {ref})")
        seen.add(pair)
        if account not in providers or ref not in refs:  # (account, ref) is not a required pair
            raise CredentialMappingInvalid(f"extra mapping for ({account}, {ref})")
        if generation_id not in generations:
            raise CredentialMappingInvalid(f"({account}, {ref}) maps to absent generation {generation_id}")
        identity, gen_account, gen_provider = generations[generation_id]
        provider = providers[account]
        if identity != ref or gen_account != account or gen_provider != provider:
            raise CredentialMappingInvalid(
                f"({account}, {ref}) maps to {generation_id} scoped ({identity}, {gen_account}, {gen_provider})")
    if len(seen) == len(providers) * len(refs):  # seen is a subset of the required pairs: all of them
        return
    missing = sorted({(account, ref) for account in providers for ref in refs} - seen)
    if missing:
        raise CredentialMappingInvalid(f"missing mapping for {', '.join(f'({a}, {r})' for a, r in missing)}")


# The configuration's accounts and credential relation as tuples of exactly the compared columns, one statement
# each, no model instances and no per-row JSON field conversion (issue 19, D-207, D-272). The JSON columns come
# as their text: equal texts decode to equal values, so each distinct text is decoded and canonicalized once per
# read. The relation is sorted in Python, where the payload sorts it (an ORDER BY ... COLLATE "C" here cost the
# database more than the sort costs Python: 60 ms against about 15 ms at 20,000 mappings).
CONFIGURATION_ACCOUNTS_SQL = """
SELECT a.account_key, a.provider_scope, c.enabled_routes::text, c.mapping_selections::text, c.policy_values::text
  FROM connector_serviceconfigurationaccount AS c
  JOIN connector_connectoraccount AS a ON a.id = c.account_id
 WHERE c.generation_id = %s
 ORDER BY c.ordinal
"""
CONFIGURATION_MAPPINGS_SQL = """
SELECT a.account_key, m.credential_ref, g.generation_id, g.credential_identity, ga.account_key, g.provider_scope,
       g.id, g.secret_version_ref, g.transport_config_digest, g.receipt_protocol, g.receipt, g.receipt_digest
  FROM connector_serviceconfigurationcredentialmapping AS m
  JOIN connector_connectoraccount AS a ON a.id = m.account_id
  JOIN connector_credentialgeneration AS g ON g.id = m.credential_generation_id
  JOIN connector_connectoraccount AS ga ON ga.id = g.account_id
 WHERE m.generation_id = %s
"""


def _configuration_rows(configuration_pk: int) -> tuple[list[tuple], list[tuple]]:
    assert (ServiceConfigurationAccount._meta.db_table, ServiceConfigurationCredentialMapping._meta.db_table) == (
        "connector_serviceconfigurationaccount", "connector_serviceconfigurationcredentialmapping")
    with connection.cursor() as cursor:
        cursor.execute(CONFIGURATION_ACCOUNTS_SQL, [configuration_pk])
        accounts = cursor.fetchall()
        cursor.execute(CONFIGURATION_MAPPINGS_SQL, [configuration_pk])
        mappings = cursor.fetchall()
    return accounts, mappings


@_retryable
def service_configuration_read(*, generation_id: str) -> ConfigurationFact:
    """The exact L2 generation, its byte-stable receipt reconstructed and compared (CV2-02-017)."""
    row = (ServiceConfigurationGeneration.objects.select_related("catalog_view")
           .filter(generation_id=generation_id).first())
    if row is None:
        raise OwnerFactInvalid(f"configuration generation {generation_id} is absent")
    accounts, mappings = _configuration_rows(row.pk)
    canonical: dict[str, bytes] = {}  # JSON text -> canonical JSON bytes, within this read only
    routes_of: dict[str, tuple[str, ...]] = {}  # enabled_routes JSON text -> its routes, within this read only
    framed: dict[str, Encoded] = {}  # ... and their canonical list, framed once
    account_rows = []
    for key, provider, routes_text, selections_text, policy_text in accounts:
        routes = framed.get(routes_text)
        if routes is None:
            listed = routes_of[routes_text] = tuple(json.loads(routes_text))
            routes = framed[routes_text] = text_list(listed)
        selections = canonical.get(selections_text)
        if selections is None:
            selections = canonical[selections_text] = receipts.canonical_json(json.loads(selections_text))
        policy = canonical.get(policy_text)
        if policy is None:
            policy = canonical[policy_text] = receipts.canonical_json(json.loads(policy_text))
        account_rows.append((key, provider, routes, selections, policy))
    relation = sorted([(account, ref, generation) for account, ref, generation, *_ in mappings])
    payload = receipts.configuration_payload_rows(
        generation_id=row.generation_id, catalog_view_key=row.catalog_view.view_key,
        catalog_revision=row.catalog_view.revision, accounts=account_rows, relation=relation)
    digest = receipts.sha256(payload)
    receipt, receipt_digest = receipts.configuration_receipt(
        generation_protocol=row.generation_protocol, generation_id=row.generation_id, generation_digest=digest)
    if not (_same(payload, row.payload) and _same(digest, row.generation_digest) and _same(receipt, row.receipt)
            and _same(receipt_digest, row.receipt_digest)):
        raise OwnerFactInvalid(f"configuration generation {generation_id} payload, digest or receipt mismatch")
    catalog = _catalog_fact(row.catalog_view)
    known = set(catalog.route_keys())
    for routes in routes_of.values():  # same verdict as per account: the accounts carry exactly these lists
        unknown = [r for r in routes if r not in known]
        if unknown:
            raise OwnerFactInvalid(f"configuration {generation_id} enables unknown routes {unknown}")
    generations = {generation: (identity, generation_account, provider)
                   for _, _, generation, identity, generation_account, provider, *_ in mappings}
    try:
        check_credential_relation(accounts=[(a[0], a[1]) for a in account_rows],
                                  required_refs=catalog.credential_refs(), relation=relation,
                                  generations=generations)
    except CredentialMappingInvalid as exc:
        raise OwnerFactInvalid(f"configuration {generation_id}: {exc.detail}") from exc
    return ConfigurationFact(row.pk, row.generation_id, row.generation_protocol, row.receipt_protocol,
                             row.catalog_view.view_key, row.catalog_view.revision, digest, receipt, receipt_digest,
                             tuple(a[0] for a in account_rows), tuple(relation),
                             {m[2]: (m[6], m[2], m[3], m[5], m[4], *m[7:]) for m in mappings})
