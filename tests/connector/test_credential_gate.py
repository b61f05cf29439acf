"""CredentialGenerationDispatchGate: revoke and explicit authorized re-enablement, each with a new fence."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from connector.actors import Actor
from connector.errors import FenceStale, PermissionRefused, TransitionRefused
from connector.models import AuditRecord, CredentialGeneration, CredentialGenerationDispatchGate
from connector.services.gates import credential_gate_transition

ACTOR = Actor.system("l2-policy")


@pytest.mark.django_db
def test_one_enabled_gate_is_created_with_each_generation(world):
    """Every credential generation has exactly one gate, created enabled at fence 1 (decision 15).
    Proves: CV2-04-003, CV2-15-007"""
    assert CredentialGenerationDispatchGate.objects.count() == CredentialGeneration.objects.count() > 0
    assert set(CredentialGenerationDispatchGate.objects.values_list("mode", "fence")) == {("enabled", 1)}


@pytest.mark.django_db
def test_revoke_then_reenable_advance_the_fence_and_never_touch_the_generation(world):
    """Revocation and re-enablement each advance the fence; the generation row is unchanged.
    Proves: CV2-04-001, CV2-04-002, CV2-04-004, CV2-04-005, CV2-04-007, CV2-04-010"""
    generation = CredentialGeneration.objects.order_by("generation_id").first()
    before = (generation.receipt, generation.secret_version_ref)
    gate = credential_gate_transition(generation_id=generation.generation_id, action="revoke", expected_fence=1,
                                      actor=ACTOR, reason="key leaked")
    assert (gate.mode, gate.fence) == ("revoked", 2)
    with pytest.raises(TransitionRefused):
        credential_gate_transition(generation_id=generation.generation_id, action="revoke", expected_fence=2,
                                   actor=ACTOR)
    with pytest.raises(TransitionRefused, match="reason"):
        credential_gate_transition(generation_id=generation.generation_id, action="reenable", expected_fence=2,
                                   actor=ACTOR)
    gate = credential_gate_transition(generation_id=generation.generation_id, action="reenable", expected_fence=2,
                                      actor=ACTOR, reason="false alarm, verified by security")
    assert (gate.mode, gate.fence) == ("enabled", 3)
    generation.refresh_from_db()
    assert (generation.receipt, generation.secret_version_ref) == before
    assert list(AuditRecord.objects.filter(entity_type="connector.CredentialGenerationDispatchGate",
                                           entity_id=str(gate.pk)).order_by("pk")
                .values_list("action", "fence")) == [("credential_gate_create", 1), ("credential_gate_revoke", 2),
                                                     ("credential_gate_reenable", 3)]


@pytest.mark.django_db
def test_stale_fence_is_refused(world):
    """Proves: CV2-04-005"""
    generation = CredentialGeneration.objects.first()
    with pytest.raises(FenceStale):
        credential_gate_transition(generation_id=generation.generation_id, action="revoke", expected_fence=7,
                                   actor=ACTOR)


@pytest.mark.django_db
def test_reenable_requires_the_permission(world):
    """A person without `reenable_credentialgenerationdispatchgate` cannot re-enable; with it, they can.
    Proves: CV2-04-002, CV2-04-004"""
    generation = CredentialGeneration.objects.first()
    credential_gate_transition(generation_id=generation.generation_id, action="revoke", expected_fence=1,
                               actor=ACTOR)
    user = User.objects.create_user("operator-1")
    with pytest.raises(PermissionRefused):
        credential_gate_transition(generation_id=generation.generation_id, action="reenable", expected_fence=2,
                                   actor=Actor.for_user(user), reason="ok")
    user.user_permissions.add(Permission.objects.get(codename="reenable_credentialgenerationdispatchgate"))
    user = User.objects.get(pk=user.pk)
    gate = credential_gate_transition(generation_id=generation.generation_id, action="reenable", expected_fence=2,
                                      actor=Actor.for_user(user), reason="ok")
    assert gate.fence == 3
