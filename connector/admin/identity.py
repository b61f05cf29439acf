"""Users and roles in the admin, under identity governance (issue 17, D-180): every change the forms make is
recorded in the append-only audit trail by connector.identity (actor, subject, before/after), shown on the user's
page; accounts are deactivated, never deleted (their approvals and audit rows keep pointing at them)."""
from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from connector.admin.base import audit_trail

User = get_user_model()
for _model in (User, Group):  # replace django.contrib.auth's registrations (auth's admin is imported first)
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


@admin.register(User)
class GovernedUserAdmin(UserAdmin):
    readonly_fields = (*UserAdmin.readonly_fields, "identity_audit")
    fieldsets = (*UserAdmin.fieldsets, ("Identity audit (append-only)", {"fields": ("identity_audit",)}))

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="identity changes")
    def identity_audit(self, obj):
        return audit_trail(User._meta.label, obj.pk) if obj and obj.pk else "-"


@admin.register(Group)
class GovernedGroupAdmin(GroupAdmin):
    readonly_fields = ("identity_audit",)
    fields = ("name", "permissions", "identity_audit")

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="role changes")
    def identity_audit(self, obj):
        return audit_trail("auth.Group", obj.pk) if obj and obj.pk else "-"

