"""Identity governance (issue 17, D-180): creating a user, granting or removing a role or permission, changing a
role's permissions, activating a user and setting a password are audited in the append-only trail (actor,
subject, before/after), and two approvals count only from independent people, so one person cannot reach two
approvals by any path the product offers: minting two approver accounts in the admin, approving beside an
account they minted, widening a role in the admin, or resetting an approver's password."""
from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse

from connector.models import AuditRecord, DualApproval, DualApprovalRequest
from tests.cutover.succession_helpers import build_succession_world
from tests.governance.test_cutover_approvals import _approve, _request
from tests.governance.test_screens import client_for


@pytest.fixture
def verified(db):
    return build_succession_world("gi-")


@pytest.fixture
def root(db):
    """A superuser created by the installation (a management command: a system actor)."""
    user = User.objects.create_superuser("root", password="root-pw-1")
    client = Client()
    client.force_login(user)
    return user, client


def _admin_create(client, username: str) -> User:
    """The admin's two-step user creation: the add form, then the change form granting the approver role."""
    response = client.post(reverse("admin:auth_user_add"), {
        "username": username, "usable_password": "true", "password1": "Minted-pw-9", "password2": "Minted-pw-9"})
    assert response.status_code == 302, response.content.decode()[:2000]
    user = User.objects.get(username=username)
    _admin_change(client, user, groups=[Group.objects.get(name="approver").pk])
    return User.objects.get(pk=user.pk)


def _admin_change(client, user: User, **changes) -> None:
    data = {"username": user.username, "first_name": "", "last_name": "", "email": "",
            "is_active": "on", "date_joined_0": "2026-01-01", "date_joined_1": "00:00:00",
            "groups": [g.pk for g in user.groups.all()], "user_permissions": []}
    data.update(changes)
    response = client.post(reverse("admin:auth_user_change", args=[user.pk]), data)
    assert response.status_code == 302, response.content.decode()[:3000]


def _identity_rows(user: User) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(entity_type="auth.User", entity_id=str(user.pk),
                                           action__startswith="identity_").order_by("pk"))


def _pending(verified, requester: User) -> DualApprovalRequest:
    _request(client_for(requester), verified.successor.epoch_id)
    return DualApprovalRequest.objects.get(state="pending")


def _legit_approver(name: str) -> User:
    """An approver provisioned by the installation (outside any request): independent of everyone."""
    user = User.objects.create_user(name, password=f"pw-{name}")
    user.groups.add(Group.objects.get(name="approver"))
    return User.objects.get(pk=user.pk)


def test_a_superuser_minted_approver_pair_cannot_complete_a_dual_approval(verified, root):
    """A superuser creates two approver accounts in the admin and approves with both: the first approval counts,
    the second is refused APPROVER_NOT_INDEPENDENT and the request stays pending. Proves: issue 17 item 2."""
    _, admin = root
    mint_a, mint_b = _admin_create(admin, "mint-a"), _admin_create(admin, "mint-b")
    row = _pending(verified, _legit_approver("req-1"))
    digest = bytes(row.subject_digest).hex()
    _approve(client_for(mint_a), row.pk, digest)
    page = _approve(client_for(mint_b), row.pk, digest).content.decode()
    assert "APPROVER_NOT_INDEPENDENT" in page
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "pending"
    assert list(DualApproval.objects.values_list("approver__username", flat=True)) == ["mint-a"]
    # an independent second person completes it
    _approve(client_for(_legit_approver("indep-2")), row.pk, digest)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "approved"


def test_a_superuser_cannot_approve_beside_an_account_they_minted_or_widened(verified, root):
    """The superuser approves (superusers hold every permission) and then an account they minted, an account
    whose role they widened in the admin, or an approver whose password they reset: each second approval is
    refused. Proves: issue 17 item 2 (no path through the admin)."""
    superuser, admin = root
    row = _pending(verified, _legit_approver("req-2"))
    digest = bytes(row.subject_digest).hex()
    _approve(client_for(superuser), row.pk, digest)
    assert DualApproval.objects.filter(approver=superuser).exists()

    minted = _admin_create(admin, "mint-c")
    assert "APPROVER_NOT_INDEPENDENT" in _approve(client_for(minted), row.pk, digest).content.decode()

    auditor = User.objects.create_user("aud-1", password="pw-aud")
    auditor.groups.add(Group.objects.get(name="auditor"))
    group = Group.objects.get(name="auditor")
    response = admin.post(reverse("admin:auth_group_change", args=[group.pk]), {
        "name": "auditor", "permissions": [*group.permissions.values_list("pk", flat=True),
                                           Permission.objects.get(codename="give_dual_approval").pk]})
    assert response.status_code == 302
    widened = User.objects.get(pk=auditor.pk)
    assert widened.has_perm("connector.give_dual_approval")
    assert "APPROVER_NOT_INDEPENDENT" in _approve(client_for(widened), row.pk, digest).content.decode()

    reset = _legit_approver("alma-2")
    response = admin.post(reverse("admin:auth_user_password_change", args=[reset.pk]), {
        "usable_password": "true", "password1": "Taken-over-7", "password2": "Taken-over-7"})
    assert response.status_code == 302
    reset = User.objects.get(pk=reset.pk)  # signed in with the new password
    assert "APPROVER_NOT_INDEPENDENT" in _approve(client_for(reset), row.pk, digest).content.decode()
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "pending"
    assert DualApproval.objects.count() == 1


def test_after_the_cooling_period_the_same_accounts_are_independent(verified, root, settings):
    """The rule is the declared cooling period (D-180): the minted pair is refused within it, and once the
    identity changes are older than the period (here: a period of zero hours) the same second approval counts.
    So the refusal comes from the recent identity changes, not from anything else about the accounts."""
    _, admin = root
    mint_a, mint_b = _admin_create(admin, "mint-d"), _admin_create(admin, "mint-e")
    row = _pending(verified, _legit_approver("req-3"))
    digest = bytes(row.subject_digest).hex()
    _approve(client_for(mint_a), row.pk, digest)
    assert "APPROVER_NOT_INDEPENDENT" in _approve(client_for(mint_b), row.pk, digest).content.decode()
    settings.CONNECTOR = {**settings.CONNECTOR, "IDENTITY_COOLING_HOURS": 0}
    _approve(client_for(mint_b), row.pk, digest)
    assert DualApprovalRequest.objects.get(pk=row.pk).state == "approved"


def test_identity_changes_are_in_the_append_only_audit_with_actor_subject_before_after(root):
    """Creation, a role grant, a permission grant and removal, deactivation and reactivation and a password set
    in the admin each leave an audit row naming the superuser as actor, the user as subject, and before/after
    (never a password hash); the rows cannot be changed or deleted by the application. Proves: issue 17 item 2;
    CV2-02-006 (audit observes)."""
    superuser, admin = root
    user = _admin_create(admin, "mint-f")
    perm = Permission.objects.get(codename="give_dual_approval")
    _admin_change(admin, user, user_permissions=[perm.pk])
    _admin_change(admin, user, user_permissions=[])
    data = {"is_active": ""}
    _admin_change(admin, User.objects.get(pk=user.pk), **data)
    _admin_change(admin, User.objects.get(pk=user.pk))
    admin.post(reverse("admin:auth_user_password_change", args=[user.pk]),
               {"usable_password": "true", "password1": "Another-pw-3", "password2": "Another-pw-3"})
    rows = _identity_rows(user)
    actions = [r.action for r in rows]
    assert actions[0] == "identity_user_create"
    for expected in ("identity_role_grant", "identity_permission_grant", "identity_permission_revoke"):
        assert expected in actions, actions
    assert {r.actor for r in rows} == {"user:root"} and {r.actor_user_id for r in rows} == {superuser.pk}
    grant = next(r for r in rows if r.action == "identity_role_grant")
    assert json.loads(grant.reason) == {"before": {}, "after": {"role": ["approver"]}}
    changes = [json.loads(r.reason) for r in rows if r.action == "identity_user_change"]
    assert {"before": {"is_active": True}, "after": {"is_active": False}} in changes
    assert {"before": {"is_active": False}, "after": {"is_active": True}} in changes
    assert {"before": {"password_set": False}, "after": {"password_set": True}} in changes
    assert not any(user.password in r.reason for r in rows)
    assert [(r.from_state, r.to_state) for r in rows if r.action == "identity_user_change"][:2] == [
        ("active", "inactive"), ("inactive", "active")]
    # the admin cannot delete an account (deactivate instead): its approvals and audit keep pointing at it
    assert admin.post(reverse("admin:auth_user_delete", args=[user.pk]), {"post": "yes"}).status_code == 403
    assert User.objects.filter(pk=user.pk).exists()
