"""Signal receivers recording every identity change in the append-only audit trail (issue 17, D-180), whatever
path made it: the admin's user and group forms, a management command (createsuperuser, changepassword,
demo_load), a shell. Connected in ConnectorConfig.ready().

Recorded (entity `auth.User` or `auth.Group`, the actor, before/after as JSON in `reason`; a password is recorded
as "set", never its hash):
- identity_user_create, identity_user_delete;
- identity_user_change: username, active (from_state/to_state active|inactive), superuser, staff, password set;
- identity_role_grant / identity_role_revoke: a group added to or removed from a user (either side of the
  relation, `clear()` included);
- identity_permission_grant / identity_permission_revoke: a permission added to or removed from a user;
- identity_group_permission_grant / identity_group_permission_revoke: a permission added to or removed from a
  role (group), recorded on the group (it reaches every member).
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import is_password_usable
from django.contrib.auth.models import Group, Permission
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from connector.services.identity import identity_record

TRACKED = ("username", "is_active", "is_staff", "is_superuser")


def _state(values: dict) -> str:
    return "active" if values.get("is_active") else "inactive"


def _snapshot(user) -> dict:
    values = {field: getattr(user, field) for field in TRACKED}
    values["password_usable"] = is_password_usable(user.password)
    return values


def user_before_save(sender, instance, raw=False, update_fields=None, **kwargs):
    if raw:
        return
    if update_fields is not None and not ({*TRACKED, "password"} & set(update_fields)):
        instance._identity_before = None  # e.g. last_login on every sign-in
        return
    if instance.pk is None:
        instance._identity_before = {}
        return
    row = sender.objects.filter(pk=instance.pk).values(*TRACKED, "password").first()
    if row is None:
        instance._identity_before = {}
        return
    password = row.pop("password")
    instance._identity_before = {**row, "password_usable": is_password_usable(password), "_password": password}


def user_after_save(sender, instance, created, raw=False, **kwargs):
    before = getattr(instance, "_identity_before", None)
    instance._identity_before = None
    if raw or before is None:
        return
    after = _snapshot(instance)
    if created or not before:
        identity_record(subject=instance, action="identity_user_create", before={}, after=after,
                        to_state=_state(after))
        return
    old_password = before.pop("_password")
    changed = {k for k in after if before.get(k) != after[k]}
    if old_password != instance.password:
        changed.add("password_set")
    if not changed:
        return
    after_view = {k: (True if k == "password_set" else after[k]) for k in sorted(changed)}
    before_view = {k: (False if k == "password_set" else before.get(k)) for k in sorted(changed)}
    identity_record(subject=instance, action="identity_user_change", before=before_view, after=after_view,
                    from_state=_state(before), to_state=_state(after))


def user_after_delete(sender, instance, **kwargs):
    identity_record(subject=instance, action="identity_user_delete", before=_snapshot(instance), after={},
                    from_state=_state(_snapshot(instance)), to_state="deleted")


def _names(model, pks) -> list[str]:
    if model is Permission:
        return sorted(f"{app}.{code}" for app, code in Permission.objects.filter(pk__in=pks)
                      .values_list("content_type__app_label", "codename"))
    if model is Group:
        return sorted(Group.objects.filter(pk__in=pks).values_list("name", flat=True))
    return sorted(str(pk) for pk in pks)


def _m2m(kind: str, owner_model, target_model):
    """A receiver for one many-to-many relation `owner_model.<field>` -> `target_model` (user.groups,
    user.user_permissions, group.permissions). `kind` names the audit actions."""
    def receiver(sender, instance, action, reverse, model, pk_set, **kwargs):
        if action == "pre_clear":
            # remember what clear() removes (post_clear carries no pk_set)
            if reverse:
                instance._identity_clearing = list(getattr(instance, _reverse_accessor(owner_model, target_model))
                                                   .values_list("pk", flat=True))
            else:
                instance._identity_clearing = list(getattr(instance, _forward_field(owner_model, target_model))
                                                   .values_list("pk", flat=True))
            return
        if action not in ("post_add", "post_remove", "post_clear"):
            return
        if action == "post_clear":
            pk_set = set(getattr(instance, "_identity_clearing", []))
        if not pk_set:
            return
        verb = "grant" if action == "post_add" else "revoke"
        if not reverse:  # instance is the owner (a user or a group); pk_set are targets
            pairs = [(instance, set(pk_set))]
        else:  # instance is a target; pk_set are owners
            pairs = [(owner, {instance.pk}) for owner in owner_model.objects.filter(pk__in=pk_set).order_by("pk")]
        for owner, targets in pairs:
            names = _names(target_model, targets)
            identity_record(subject=owner, action=f"identity_{kind}_{verb}",
                            before={} if verb == "grant" else {kind: names},
                            after={kind: names} if verb == "grant" else {})
    return receiver


def _forward_field(owner_model, target_model) -> str:
    user = get_user_model()
    return {(user, Group): "groups", (user, Permission): "user_permissions", (Group, Permission): "permissions"}[
        (owner_model, target_model)]


def _reverse_accessor(owner_model, target_model) -> str:
    user = get_user_model()
    return {(user, Group): "user_set", (user, Permission): "user_set", (Group, Permission): "group_set"}[
        (owner_model, target_model)]


_RECEIVERS = []


def connect() -> None:
    user = get_user_model()
    pre_save.connect(user_before_save, sender=user, dispatch_uid="connector.identity.before")
    post_save.connect(user_after_save, sender=user, dispatch_uid="connector.identity.after")
    post_delete.connect(user_after_delete, sender=user, dispatch_uid="connector.identity.delete")
    for through, kind, owner, target in ((user.groups.through, "role", user, Group),
                                         (user.user_permissions.through, "permission", user, Permission),
                                         (Group.permissions.through, "group_permission", Group, Permission)):
        receiver = _m2m(kind, owner, target)
        _RECEIVERS.append(receiver)  # signals hold weak references
        m2m_changed.connect(receiver, sender=through, dispatch_uid=f"connector.identity.{kind}")
