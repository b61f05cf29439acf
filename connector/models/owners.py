"""Owner generations: accounts, pack generations and their binding definitions, the Catalog view, credential
generations and the L2 service configuration generation.

Every generation row is an immutable fact: the database refuses UPDATE on these tables (trigger
`connector_forbid_update`), and a row referenced by a ServingEpoch cannot be deleted (foreign keys from the
epoch proof rows). Each carries the owner's deterministic receipt bytes and digest, written once at authoring.
"""
from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Length

from connector.choices import BindingKind

__all__ = [
    "ConnectorAccount",
    "PackGeneration",
    "BindingDefinition",
    "IntegrationBindingView",
    "CatalogBinding",
    "CredentialGeneration",
    "ServiceConfigurationGeneration",
    "ServiceConfigurationAccount",
    "ServiceConfigurationCredentialMapping",
]


def _digest_len(field: str, name: str) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__length": 32}), name=name,
                                  violation_error_code="digest_length")


models.BinaryField.register_lookup(Length)


class ConnectorAccount(models.Model):
    """A connector account (tenant-side integration account). Invariant: `account_key` is canonical and unique."""

    account_key = models.CharField(max_length=255, unique=True)
    provider_scope = models.CharField(max_length=255)
    display_name = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(condition=~Q(account_key=""), name="connector_account_key_nonempty"),
        ]

    def __str__(self) -> str:
        return self.account_key


class PackGeneration(models.Model):
    """One immutable installed generation of an L1 pack. Invariant: never updated; payload digest is over the
    exact stored payload bytes; deletable only while nothing references it."""

    generation_id = models.CharField(max_length=255, unique=True)
    owner_pack = models.CharField(max_length=255)
    pack_installation_id = models.CharField(max_length=255)
    definition_envelope_version = models.PositiveIntegerField()
    definition_receipt_version = models.PositiveIntegerField()
    payload = models.BinaryField()
    payload_digest = models.BinaryField(max_length=32)
    receipt = models.BinaryField()
    receipt_digest = models.BinaryField(max_length=32)
    installed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            _digest_len("payload_digest", "connector_packgeneration_payload_digest_len"),
            _digest_len("receipt_digest", "connector_packgeneration_receipt_digest_len"),
        ]

    def __str__(self) -> str:
        return f"{self.owner_pack} @ {self.generation_id}"


class BindingDefinition(models.Model):
    """The exact definition payload of one binding kind inside one pack generation; read only through the
    kind-specific owner reader. Invariant: immutable; one per (pack generation, kind, business key, version)."""

    pack_generation = models.ForeignKey(PackGeneration, on_delete=models.PROTECT, related_name="definitions")
    kind = models.CharField(max_length=32, choices=BindingKind.choices)
    business_key = models.CharField(max_length=255)
    definition_version = models.PositiveIntegerField()
    definition = models.BinaryField()
    canonical_definition_digest = models.BinaryField(max_length=32)
    receipt = models.BinaryField()
    receipt_digest = models.BinaryField(max_length=32)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.UniqueConstraint(fields=["pack_generation", "kind", "business_key", "definition_version"],
                                    name="connector_bindingdefinition_unique_identity"),
            models.CheckConstraint(condition=Q(kind__in=BindingKind.values), name="connector_bindingdefinition_kind"),
            _digest_len("canonical_definition_digest", "connector_bindingdefinition_digest_len"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.business_key} v{self.definition_version}"


class IntegrationBindingView(models.Model):
    """One immutable revision of a Catalog IntegrationBindingView. The current view of a lineage is its highest
    revision; a revision is a freshness lower bound, never an exact historical selector."""

    view_key = models.CharField(max_length=255)
    revision = models.PositiveIntegerField()
    organization = models.CharField(max_length=255)
    application_installation = models.CharField(max_length=255)
    authorized_workload = models.CharField(max_length=255)
    lineage_revision = models.CharField(max_length=255)
    source_snapshot_digest = models.BinaryField(max_length=32)
    view_digest = models.BinaryField(max_length=32)
    receipt_protocol = models.CharField(max_length=255)
    security_epoch = models.PositiveIntegerField()
    capability_version = models.CharField(max_length=255)
    receipt = models.BinaryField()
    receipt_digest = models.BinaryField(max_length=32)
    published_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["view_key", "revision"]
        constraints = [
            models.UniqueConstraint(fields=["view_key", "revision"], name="connector_bindingview_unique_revision"),
            _digest_len("view_digest", "connector_bindingview_view_digest_len"),
        ]

    def __str__(self) -> str:
        return f"{self.view_key} r{self.revision}"


class CatalogBinding(models.Model):
    """One ordered binding of a Catalog view: authorization and identity only, never definition proof
    (CV2-02-009). Invariant: immutable; ordinals dense from 0; one per (view, kind, business key)."""

    view = models.ForeignKey(IntegrationBindingView, on_delete=models.PROTECT, related_name="bindings")
    ordinal = models.PositiveIntegerField()
    row_id = models.CharField(max_length=64)
    identity_digest = models.BinaryField(max_length=32)
    kind = models.CharField(max_length=32, choices=BindingKind.choices)
    owner_pack = models.CharField(max_length=255)
    pack_generation = models.ForeignKey(PackGeneration, on_delete=models.PROTECT, related_name="catalog_bindings")
    pack_installation_id = models.CharField(max_length=255)
    pack_payload_digest = models.BinaryField(max_length=32)
    business_key = models.CharField(max_length=255)
    definition_version = models.PositiveIntegerField()
    credential_refs = models.JSONField(default=list)
    runtime_command_definition_id = models.CharField(max_length=255, null=True, blank=True)
    runtime_command_version = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["view", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["view", "ordinal"], name="connector_catalogbinding_unique_ordinal"),
            models.UniqueConstraint(fields=["view", "kind", "business_key"],
                                    name="connector_catalogbinding_unique_business_key"),
            models.CheckConstraint(condition=Q(kind__in=BindingKind.values), name="connector_catalogbinding_kind"),
            models.CheckConstraint(
                condition=(Q(runtime_command_definition_id__isnull=True, runtime_command_version__isnull=True)
                           | Q(runtime_command_definition_id__isnull=False, runtime_command_version__isnull=False)),
                name="connector_catalogbinding_runtime_tuple_whole"),
        ]

    def __str__(self) -> str:
        return f"#{self.ordinal} {self.kind}:{self.business_key}"


class CredentialGeneration(models.Model):
    """An immutable credential generation: stable identity, generation ID, provider/account scope, the secret
    backend's immutable version reference and the digest of non-secret transport configuration. Never holds
    secret bytes. Its dispatch eligibility is a separate fact (CredentialGenerationDispatchGate)."""

    generation_id = models.CharField(max_length=255, unique=True)
    credential_identity = models.CharField(max_length=255)
    provider_scope = models.CharField(max_length=255)
    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="credential_generations")
    secret_version_ref = models.CharField(max_length=255)
    transport_config_digest = models.BinaryField(max_length=32)
    receipt_protocol = models.CharField(max_length=255)
    receipt = models.BinaryField()
    receipt_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["generation_id"]
        constraints = [
            _digest_len("transport_config_digest", "connector_credentialgeneration_transport_digest_len"),
        ]

    def __str__(self) -> str:
        return f"{self.credential_identity} @ {self.generation_id}"


class ServiceConfigurationGeneration(models.Model):
    """One immutable L2 ConnectorServiceConfigurationGeneration: the exhaustive ordered account set, enabled
    routes, mapping selections, policy values and the exhaustive credential relation, frozen as canonical
    payload bytes with the owner's receipt."""

    generation_id = models.CharField(max_length=255, unique=True)
    generation_protocol = models.CharField(max_length=255)
    receipt_protocol = models.CharField(max_length=255)
    catalog_view = models.ForeignKey(IntegrationBindingView, on_delete=models.PROTECT,
                                     related_name="configuration_generations")
    payload = models.BinaryField()
    generation_digest = models.BinaryField(max_length=32)
    receipt = models.BinaryField()
    receipt_digest = models.BinaryField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [_digest_len("generation_digest", "connector_serviceconfiguration_digest_len")]

    def __str__(self) -> str:
        return self.generation_id


class ServiceConfigurationAccount(models.Model):
    """One account of a configuration generation, in its canonical order."""

    generation = models.ForeignKey(ServiceConfigurationGeneration, on_delete=models.PROTECT, related_name="accounts")
    ordinal = models.PositiveIntegerField()
    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="configurations")
    enabled_routes = models.JSONField(default=list)
    mapping_selections = models.JSONField(default=dict)
    policy_values = models.JSONField(default=dict)

    class Meta:
        ordering = ["generation", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "ordinal"], name="connector_configaccount_unique_ordinal"),
            models.UniqueConstraint(fields=["generation", "account"], name="connector_configaccount_unique_account"),
        ]


class ServiceConfigurationCredentialMapping(models.Model):
    """One pair of the exhaustive (account, binding CredentialRef) -> CredentialGenerationID relation."""

    generation = models.ForeignKey(ServiceConfigurationGeneration, on_delete=models.PROTECT,
                                   related_name="credential_mappings")
    account = models.ForeignKey(ConnectorAccount, on_delete=models.PROTECT, related_name="+")
    credential_ref = models.CharField(max_length=255)
    credential_generation = models.ForeignKey(CredentialGeneration, on_delete=models.PROTECT,
                                              related_name="configuration_mappings")

    class Meta:
        ordering = ["generation", "account", "credential_ref"]
        constraints = [
            models.UniqueConstraint(fields=["generation", "account", "credential_ref"],
                                    name="connector_configcredential_unique_mapping"),
        ]
