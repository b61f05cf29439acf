"""Load the REST bulk delivery demo once (idempotent): the contract's approval receipt, a receiver binding to the
demo receiver (`python -m demo.receiver`, started by `make run`), its certification, a sync partition-replace
profile, and one planned parent whose children the Celery sweep delivers on its own."""
from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from connector.actors import Actor
from effects.models import DeliveryParent, DeliveryProfile, ReceiverBinding
from effects.services.delivery import planning, setup

NAMESPACE = {"platform_instance_id": "demo", "tenant_id": "demo-tenant", "environment_id": "local",
             "namespace_revision": 1}


class Command(BaseCommand):
    help = "Load the REST bulk delivery demo (binding, certification, profile, one parent plan)."

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username="operator").first()
        if user is None:
            self.stderr.write("run `manage.py demo_load` first (it creates the operator)")
            return
        actor = Actor.for_user(user)
        base = f"http://127.0.0.1:{os.environ.get('DEMO_RECEIVER_PORT', '8900')}"
        if not setup.contract_approved():
            setup.approval_record(actor=actor, adr_digests=["demo-adr"], owner_approvals=["demo-security"],
                                  evidence_requirements=["tests/effects/delivery"])
        binding = ReceiverBinding.objects.filter(name="demo-warehouse").first()
        if binding is None:
            binding = setup.binding_create(
                actor=actor, name="demo-warehouse", base_url=base, authentication_mode="bearer",
                secret=b"demo-delivery-token", authority_origin=base, remote_principal_id="svc-demo-writer",
                remote_account_id="demo-account", remote_resource_namespace="warehouse",
                tls_policy_identity="loopback-plaintext", network_policy_identity="loopback")
            setup.certification_request(actor=actor, binding=binding, assurance_mode="receiver_attested",
                                        handshake={"principal_id": "svc-demo-writer", "account_id": "demo-account"},
                                        evidence_ref="demo handshake", valid_until=datetime.now(UTC) + timedelta(
                                            days=365))
        profile = DeliveryProfile.objects.filter(name="demo-daily-orders").first()
        if profile is None:
            profile = setup.profile_create(
                actor=actor, name="demo-daily-orders", receiver_kind="sync_batch",
                mutation_policy="partition_replace", scope_kind="timestamp",
                operation_semantics={
                    "method_semantics": "POST", "authority_relative_path_semantics": "/bulk/orders",
                    "normalized_query_semantics": {}, "non_secret_header_semantics": {
                        "Content-Type": "application/json"},
                    "canonical_body_envelope_semantics": "json-records.v1",
                    "acknowledgement_contract": {"kind": "sync_counts"},
                    "mutation_fence_contract": "idempotency-key=receiver_mutation_key",
                    "verification_contract": "applied-count-and-payload-sha256"},
                execution_policy={"retry_policy": {"max_attempts": 3, "backoff_seconds": 2,
                                                   "max_retry_after_seconds": 60},
                                  "timeout_policy": {"connect_seconds": 2, "read_seconds": 10},
                                  "rate_limit_policy": {"per_second": 10},
                                  "concurrency_policy": {"remote_job_capacity": 2, "max_in_flight_children": 2},
                                  "retention_policy": {"evidence_days": 400}, "observability_policy": {}},
                profile_schema_id="dpone.rest_delivery_profile.v1", profile_version=1, max_records_per_child=3)
        if not DeliveryParent.objects.filter(parent_key="demo-orders-day-1").exists():
            day = datetime(2026, 12, 1, tzinfo=UTC)
            records = [{"at": (day + timedelta(hours=2 * h)).isoformat(), "order": f"o-{h}", "total": 10 * h}
                       for h in range(7)]
            parent = planning.parent_plan_and_admit(planning.PlanRequest(
                namespace=NAMESPACE, parent_key="demo-orders-day-1", binding=binding, profile=profile,
                logical_route_id="orders.daily", source_boundary="demo-snapshot-1", receiver_resource_id="orders",
                effect_conflict_group="daily", scope_start=day, scope_end=day + timedelta(days=1),
                interval_end=day + timedelta(days=1), correction_revision=0, records=records))
            self.stdout.write(self.style.SUCCESS(
                f"Delivery demo: parent {parent.parent_key} admitted with {parent.children.count()} children; the "
                "beat sweep delivers them (manage.py delivery status demo-orders-day-1)"))
        else:
            self.stdout.write("Delivery demo already loaded: nothing to do.")
