"""Parent plan barriers, MAY_ATTEMPT markers, checkpoint promotion, binding identity across rotation, and the
api_key_query / platform attestation rules."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction

from connector.actors import Actor
from connector.models import AuditRecord
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryError, DeliveryPermissionDenied, DeliveryRequestInvalid
from effects.models import DeliveryOperation, DeliveryParent, MayAttemptMarker
from effects.services.delivery import execution, planning, runner, setup
from tests.effects.delivery.world import NAMESPACE, T0, operator
from tests import dbroles


def _audit(entity, action):
    return list(AuditRecord.objects.filter(entity_type=entity._meta.label, entity_id=str(entity.pk),
                                           action=action).order_by("pk"))


def test_seal_all_children_precedes_first_mutation(world):
    """Every child is inserted and sealed (payload digest persisted) in the parent's admission transaction,
    before the parent is ADMITTED; no child exists in `planned` afterwards. Proves:
    seal_all_children_precedes_first_mutation"""
    parent = world.plan(records=[{"at": (T0 + timedelta(hours=h)).isoformat(), "id": h} for h in range(5)])
    children = list(parent.children.order_by("ordinal"))
    assert [c.state for c in children] == ["sealed"] * 3
    admit = _audit(parent, "delivery_parent_admit")[0]
    seals = [_audit(c, "delivery_seal")[0] for c in children]
    assert all(seal.pk < admit.pk for seal in seals)
    assert parent.coverage_proof["tiles"] is True and parent.coverage_proof["records"] == 5
    assert [c.record_count for c in children] == [2, 2, 1]
    assert children[0].scope.lower == T0 and children[-1].scope.upper == T0 + timedelta(days=1)
    assert all(a.scope.upper == b.scope.lower for a, b in zip(children, children[1:]))


def test_complete_parent_plan_precedes_first_mutation(world, sync_receiver):
    """A failure while admitting any child rolls the whole plan back: no child, parent still PLANNING, nothing
    sent; a parent that is not ADMITTED never submits. Proves: complete_parent_plan_precedes_first_mutation"""
    real = planning.check_generation_fence
    calls = {"n": 0}

    def fail_on_second(**kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise DeliveryError("REST_DELIVERY_OVERLAPPING_EFFECT_IN_FLIGHT", "injected on the second child")
        return real(**kwargs)

    with mock.patch.object(planning, "check_generation_fence", fail_on_second), pytest.raises(DeliveryError):
        world.plan()
    parent = DeliveryParent.objects.get(parent_key="p1")
    assert parent.state == "PLANNING" and parent.children.count() == 0 and sync_receiver.requests == []
    admitted = world.plan()  # the same inputs continue the frozen parent and admit it whole
    assert admitted.pk == parent.pk and admitted.state == "ADMITTED" and admitted.children.count() == 2


def test_source_snapshot_closes_before_first_mutation(world, sync_receiver):
    """The frozen parent is materialized and its snapshot closed (with its digest verified) before planning; the
    first attempt comes later. Proves: source_snapshot_closes_before_first_mutation"""
    parent = world.plan()
    runner.drive_parent(parent.pk)
    first_attempt = parent.children.first().attempts.order_by("created_at").first()
    assert parent.snapshot_closed_at is not None and parent.snapshot_closed_at < parent.admitted_at
    assert parent.admitted_at < first_attempt.created_at
    assert _audit(parent, "delivery_parent_materialize")[0].pk < _audit(parent, "delivery_parent_admit")[0].pk


def test_existing_parent_never_replans(world, sync_receiver):
    """Planning the same parent again returns it untouched (no new children, nothing resent); different inputs
    under the same parent key are REST_DELIVERY_INTENT_CONFLICT. Proves: existing_parent_never_replans"""
    parent = world.plan()
    runner.drive_parent(parent.pk)
    sent = len(sync_receiver.mutations())
    again = world.plan()
    assert again.pk == parent.pk and again.parent_plan_digest == parent.parent_plan_digest
    assert again.children.count() == 2 and len(sync_receiver.mutations()) == sent
    with pytest.raises(DeliveryError) as refused:
        world.plan(records=[{"at": T0.isoformat(), "id": "other"}])
    assert refused.value.code == "REST_DELIVERY_INTENT_CONFLICT"


def test_immutable_pre_attempt_marker_precedes_submitting(world, sync_receiver):
    """The MAY_ATTEMPT marker exists, committed with the attempt row, the capacity reservation and the CAS to
    SUBMITTING; it is immutable; a failure inside the submit transaction leaves none of the four.
    Proves: immutable_pre_attempt_marker_precedes_submitting"""
    parent = world.plan()
    op = parent.children.first()
    with mock.patch.object(execution, "move", side_effect=RuntimeError("crash before the CAS")), \
            pytest.raises(RuntimeError):
        execution.submit(op.pk)
    op.refresh_from_db()
    assert op.state == "sealed" and not MayAttemptMarker.objects.filter(operation=op).exists()
    assert op.attempts.count() == 0
    result = execution.submit(op.pk)
    op.refresh_from_db()
    marker = MayAttemptMarker.objects.get(operation=op)
    assert op.state == "submitting" and result.attempt.marker_id == marker.pk
    assert result.attempt.capacity_state == "reserved" and marker.kind == "MAY_ATTEMPT"
    assert marker.journal_epoch == 1 and bytes(marker.mutation_intent_digest) == bytes(op.mutation_intent_digest)
    with dbroles.as_admin(), pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE effects_mayattemptmarker SET generation = 'x' WHERE id = %s", [marker.pk])


def test_may_attempt_marker_is_attempt_scoped(world, sync_receiver):
    """One marker per (namespace, operation, attempt ordinal): a retry gets a new ordinal, a new attempt ID and
    its own marker; inserting a second marker for the same ordinal is refused by the unique key.
    Proves: may_attempt_marker_is_attempt_scoped"""
    sync_receiver.queue("rate_limit")
    parent = world.plan()
    op = parent.children.first()
    runner.step(op.pk)
    op.refresh_from_db()
    assert op.state == "retry_wait"
    DeliveryOperation.objects.filter(pk=op.pk).update(next_attempt_after=datetime.now(UTC))
    runner.step(op.pk)
    markers = list(MayAttemptMarker.objects.filter(operation=op).order_by("attempt_ordinal"))
    assert [m.attempt_ordinal for m in markers] == [1, 2] and markers[0].attempt_id != markers[1].attempt_id
    assert [a.attempt_id for a in op.attempts.order_by("ordinal")] == [m.attempt_id for m in markers]
    with pytest.raises(IntegrityError), transaction.atomic():
        MayAttemptMarker.objects.create(attempt_ordinal=2, operation=op, operation_namespace=bytes(op.namespace),
                                        parent_and_child_identity="x", generation="g", expected_journal_revision=0,
                                        journal_epoch=1, mutation_intent_digest=b"x" * 32)


def test_request_not_started_can_retry_with_same_delivery_key(world, sync_receiver):
    """A request that provably never started retries with the same delivery key and receiver mutation key.
    Proves: request_not_started_can_retry_with_same_delivery_key"""
    sync_receiver.queue("rate_limit")
    parent = world.plan()
    op = parent.children.first()
    runner.step(op.pk)
    DeliveryOperation.objects.filter(pk=op.pk).update(next_attempt_after=datetime.now(UTC))
    runner.drive_parent(parent.pk)
    op.refresh_from_db()
    keys = {r["key"] for r in sync_receiver.mutations() if r["key"] == bytes(op.receiver_mutation_key).hex()}
    assert op.state == "final_full_eligible" or op.state == "final_full_promoted"
    assert keys == {bytes(op.receiver_mutation_key).hex()} and sync_receiver.applied[keys.pop()] == 1
    assert op.attempt_ordinal == 2


def test_checkpoint_requires_verified_full_effect(world, sync_receiver):
    """Only FULLY_APPLIED + PASSED tuples carry ELIGIBLE/PROMOTED; a full count whose payload digest does not
    verify ends final_full_unverified (BLOCKED) and holds the frontier back for every later child.
    Proves: checkpoint_requires_verified_full_effect"""
    c = contract()
    for name, (execution_, effect, _ack, verification, checkpoint) in c.tuples.items():
        if checkpoint != "BLOCKED":
            assert (effect, verification) == ("FULLY_APPLIED", "PASSED"), name
    sync_receiver.queue("digest_mismatch", "full")
    parent = world.plan()
    states = runner.drive_parent(parent.pk)
    parent.refresh_from_db()
    assert states == ["final_full_unverified", "final_full_eligible"]
    assert parent.contiguous_checkpoint_frontier == 0


def test_success_effect_authority_survives_maximum_replay_horizon(world, sync_receiver):
    """A fully applied partition generation's authority is the permanent watermark: a replay of the same
    generation under another parent, at any later time, is refused STALE and nothing is resent.
    Proves: success_effect_authority_survives_maximum_replay_horizon"""
    parent = world.plan()
    runner.drive_parent(parent.pk)
    sent = len(sync_receiver.mutations())
    with pytest.raises(DeliveryError) as refused:
        world.plan(parent_key="replay-much-later", namespace={**NAMESPACE, "namespace_revision": 2})
    assert refused.value.code == "REST_DELIVERY_STALE_GENERATION" and len(sync_receiver.mutations()) == sent
    assert contract().raw["effect_authority_retention"]["partition_replace"] == \
        "permanent_highest_applied_generation_per_conflict_scope"


def test_credential_rotation_preserves_binding_when_semantics_unchanged(world, sync_receiver):
    """Rotating the secret adds a version: the binding identity, intents and delivery are unchanged and the new
    secret is used. Proves: credential_rotation_preserves_binding_when_semantics_unchanged"""
    before = bytes(world.binding.semantics_digest)
    parent = world.plan()
    intents = [bytes(c.mutation_intent_digest) for c in parent.children.all()]
    setup.secret_rotate(actor=Actor.for_user(world.admin), binding=world.binding, secret=b"rotated-token")
    world.binding.refresh_from_db()
    assert bytes(world.binding.semantics_digest) == before
    assert [bytes(c.mutation_intent_digest) for c in parent.children.all()] == intents
    runner.drive_parent(parent.pk)
    assert {r["headers"]["Authorization"] for r in sync_receiver.mutations()} == {"Bearer rotated-token"}


def test_api_key_query_refused_without_every_exception_requirement(world):
    actor = Actor.for_user(world.admin)
    fields = dict(authority_origin="https://r", remote_principal_id="p", remote_account_id="a",
                  remote_resource_namespace="n", tls_policy_identity="t", network_policy_identity="net")
    with pytest.raises(DeliveryRequestInvalid, match="missing: .*log_trace_exception_waf_receiver_review"):
        setup.binding_create(actor=actor, name="q", base_url="https://r", authentication_mode="api_key_query",
                             secret=b"k", api_key_query_exception={"immutable_profile_exception": "x",
                                                                    "security_approval": "y",
                                                                    "end_to_end_url_redaction": "z"}, **fields)
    with pytest.raises(DeliveryRequestInvalid, match="not supported"):
        setup.binding_create(actor=actor, name="q", base_url="https://r", authentication_mode="digest",
                             secret=b"k", **fields)


def test_platform_attested_certification_needs_two_distinct_approvers(world):
    """platform_attested stays pending until two distinct users approve; the requester cannot approve; the same
    person cannot approve twice; an expired certification refuses delivery (periodic recertification)."""
    actor = Actor.for_user(world.admin)
    cert = setup.certification_request(actor=actor, binding=world.binding, assurance_mode="platform_attested",
                                       handshake={"principal_id": "svc-crm-writer", "account_id": "acct-42"},
                                       evidence_ref="handshake:2",
                                       valid_until=datetime.now(UTC) + timedelta(days=1))
    assert cert.state == "pending_approval"
    with pytest.raises(DeliveryPermissionDenied, match="requester"):
        setup.certification_approve(actor=actor, certification=cert,
                                    digest_seen=setup.certification_subject_digest(cert))
    second = operator("approver-two", "effects.approve_certification")
    cert = setup.certification_approve(actor=Actor.for_user(world.approver), certification=cert,
                                    digest_seen=setup.certification_subject_digest(cert))
    assert cert.state == "pending_approval"
    with pytest.raises(DeliveryPermissionDenied, match="already approved"):
        setup.certification_approve(actor=Actor.for_user(world.approver), certification=cert,
                                    digest_seen=setup.certification_subject_digest(cert))
    cert = setup.certification_approve(actor=Actor.for_user(second), certification=cert,
                                    digest_seen=setup.certification_subject_digest(cert))
    assert cert.state == "certified" and cert.approvals.count() == 2
    nobody = operator("no-perms")
    with pytest.raises(DeliveryPermissionDenied):
        setup.certification_approve(actor=Actor.for_user(nobody), certification=cert,
                                    digest_seen=setup.certification_subject_digest(cert))
    assert setup.certification_expire_due(now=datetime.now(UTC) + timedelta(days=400)) == 2
    parent = world.plan()
    with pytest.raises(DeliveryRequestInvalid, match="no current certification"):
        execution.submit(parent.children.first().pk)
