"""A delivery world for tests: operators with their permissions, the contract approval receipt, a certified
receiver binding pointing at a loopback DeliveryReceiver, sync and async profiles, and plan helpers."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.contrib.auth.models import Permission, User

from connector.actors import Actor
from effects.services.delivery import planning, setup

NAMESPACE = {"platform_instance_id": "crm-eu-1", "tenant_id": "tenant-7", "environment_id": "prod",
             "namespace_revision": 1}
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def operator(username: str, *perms: str) -> User:
    user, _ = User.objects.get_or_create(username=username)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return User.objects.get(pk=user.pk)  # fresh permission cache


def semantics(path: str = "/bulk", *, poll_path: str | None = None) -> dict:
    ack = {"kind": "async_job_receipt", "poll_path": poll_path} if poll_path else {"kind": "sync_counts"}
    return {"method_semantics": "POST", "authority_relative_path_semantics": path,
            "normalized_query_semantics": {}, "non_secret_header_semantics": {"Content-Type": "application/json"},
            "canonical_body_envelope_semantics": "json-records.v1", "acknowledgement_contract": ack,
            "mutation_fence_contract": "idempotency-key=receiver_mutation_key",
            "verification_contract": "applied-count-and-payload-sha256"}


def policy(**overrides) -> dict:
    base = {"retry_policy": {"max_attempts": 3, "backoff_seconds": 0, "max_retry_after_seconds": 5},
            "timeout_policy": {"connect_seconds": 1, "read_seconds": 2},
            "rate_limit_policy": {"per_second": 50},
            "concurrency_policy": {"remote_job_capacity": 4, "max_in_flight_children": 4},
            "retention_policy": {"evidence_days": 400}, "observability_policy": {"trace": True}}
    base.update(overrides)
    return base


@dataclass
class World:
    admin: User
    approver: User
    binding: object
    sync: object
    asyncp: object
    append: object

    def plan(self, *, profile=None, parent_key="p1", start=T0, end=T0 + timedelta(days=1), revision=0,
             interval_end=None, records=None, group="g1", resource="orders", binding=None, namespace=None):
        profile = profile or self.sync
        if records is None:
            records = [{"at": (start + timedelta(hours=h)).isoformat(), "id": f"r{h}", "v": h} for h in range(4)]
        return planning.parent_plan_and_admit(planning.PlanRequest(
            namespace=namespace or NAMESPACE, parent_key=parent_key, binding=binding or self.binding,
            profile=profile, logical_route_id="orders.daily", source_boundary="snapshot-1",
            receiver_resource_id=resource, effect_conflict_group=group, scope_start=start, scope_end=end,
            interval_end=interval_end or end, correction_revision=revision, records=records))


def build(receiver_url: str, *, kind_suffix: str = "") -> World:
    admin = operator("delivery-admin", "effects.approve_journal_epoch", "effects.reconcile_delivery",
                     "effects.approve_certification")
    approver = operator("delivery-approver", "effects.approve_certification", "effects.reconcile_delivery",
                        "effects.approve_journal_epoch")
    actor = Actor.for_user(admin)
    if not setup.contract_approved():
        setup.approval_record(actor=actor, adr_digests=["adr-0042:" + "a" * 64], owner_approvals=["security"],
                              evidence_requirements=["failure-scenarios-e2e"])
    binding = setup.binding_create(
        actor=actor, name="receiver" + kind_suffix, base_url=receiver_url, authentication_mode="bearer",
        secret=b"s3cret-token", authority_origin=receiver_url, remote_principal_id="svc-crm-writer",
        remote_account_id="acct-42", remote_resource_namespace="warehouse", tls_policy_identity="tls-default",
        network_policy_identity="egress-loopback")
    setup.certification_request(actor=actor, binding=binding, assurance_mode="receiver_attested",
                                handshake={"principal_id": "svc-crm-writer", "account_id": "acct-42"},
                                evidence_ref="handshake:1", valid_until=datetime.now(UTC) + timedelta(days=30))
    sync = setup.profile_create(actor=actor, name="sync" + kind_suffix, receiver_kind="sync_batch",
                                mutation_policy="partition_replace", scope_kind="timestamp",
                                operation_semantics=semantics(), execution_policy=policy(),
                                profile_schema_id="dpone.rest_delivery_profile.v1", profile_version=1,
                                max_records_per_child=2)
    asyncp = setup.profile_create(actor=actor, name="async" + kind_suffix, receiver_kind="async_bulk_job",
                                  mutation_policy="partition_replace", scope_kind="timestamp",
                                  operation_semantics=semantics("/jobs", poll_path="/jobs"),
                                  execution_policy=policy(), profile_schema_id="dpone.rest_delivery_profile.v1",
                                  profile_version=1, max_records_per_child=2)
    append = setup.profile_create(actor=actor, name="append" + kind_suffix, receiver_kind="sync_batch",
                                  mutation_policy="incremental_append", scope_kind="date",
                                  operation_semantics=semantics("/append"), execution_policy=policy(),
                                  profile_schema_id="dpone.rest_delivery_profile.v1", profile_version=1,
                                  max_records_per_child=10)
    return World(admin, approver, binding, sync, asyncp, append)
