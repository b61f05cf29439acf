"""Who controlled an account recently, read from the append-only audit trail (D-180, docs/security.md).

A person controls an account when, within the identity cooling period, they created it, granted or removed one
of its roles, permissions or flags (superuser, staff), activated or deactivated it, renamed it, set its password,
or changed the permissions of a role (group) it holds. The account's holder always controls it. System actors
(migrations, the demo loader, a management command) control nothing here: they are the installation itself, and
their changes are audited all the same."""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from connector.models import AuditRecord

USER_ACTIONS = ("identity_user_create", "identity_user_change", "identity_role_grant", "identity_role_revoke",
                "identity_permission_grant", "identity_permission_revoke", "identity_user_delete")
GROUP_ACTIONS = ("identity_group_permission_grant", "identity_group_permission_revoke")


def cooling_period() -> timedelta:
    return timedelta(hours=settings.CONNECTOR.get("IDENTITY_COOLING_HOURS", 168))


def controllers(user_id: int, *, at: datetime | None = None) -> set[int]:
    """The ids of the people who controlled the account `user_id` within the cooling period before `at`
    (itself included)."""
    since = (at or timezone.now()) - cooling_period()
    user_label = get_user_model()._meta.label
    found = set(AuditRecord.objects.filter(
        entity_type=user_label, entity_id=str(user_id), action__in=USER_ACTIONS, at__gte=since,
        actor_user_id__isnull=False).values_list("actor_user_id", flat=True))
    groups = [str(g) for g in get_user_model().groups.through.objects.filter(user_id=user_id)
              .values_list("group_id", flat=True)]
    if groups:
        found |= set(AuditRecord.objects.filter(
            entity_type="auth.Group", entity_id__in=groups, action__in=GROUP_ACTIONS, at__gte=since,
            actor_user_id__isnull=False).values_list("actor_user_id", flat=True))
    return found | {user_id}


def dependent_on(user_id: int, others: list[int], *, at: datetime | None = None) -> dict[int, set[int]]:
    """For each of `others` that shares a controller with `user_id`: the shared controllers."""
    mine = controllers(user_id, at=at)
    shared = {}
    for other in others:
        common = mine & controllers(other, at=at)
        if common:
            shared[other] = common
    return shared
