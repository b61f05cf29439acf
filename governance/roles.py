"""The four operator roles as Django groups, each a closed list of permissions (synced after every migrate, so a
fresh database has them). The services check the same permissions: a role grants nothing a service would not
check itself.

- auditor: read-only; opens every screen and browses every fact in the admin.
- operator: auditor + reconciles uncertain effects and delivery operations, resolves RemoteLink conflicts (a
  relink also needs two approvers), replays quarantined executions (`connector.add_replayrequest`, the API's
  replay too), resumes halted ordering lanes with evidence, operates serving gates, terminates holder
  generations, authorizes an intentional new remote call for an effect root (D-305), releases items held by a
  step failure after the fix (`governance.release_held_item`, one or many at once: D-490).
- approver: auditor + approves journal-epoch reopenings and coordinates successor epochs (halting gates
  included, so the approver can run every succession phase from the console) (and, with the rest of
  the cutover work, restore points, readiness certificates and activation decisions: requests and gives dual
  approvals of those subjects).
- certifier: auditor + approves platform-attested receiver certifications (dual approval).
"""
from __future__ import annotations

from django.contrib.auth.models import Group, Permission

VIEW_APPS = ("connector", "effects", "cutover")
OPERATOR = ("effects.reconcile_effect", "effects.reconcile_delivery", "connector.operate_accountservinggate",
            "effects.change_remoteeffect", "effects.change_dispatchpermit", "effects.change_processgeneration",
            "connector.add_replayrequest", "connector.resume_orderinglane", "effects.authorize_remote_call",
            "governance.release_held_item")
APPROVER = ("effects.approve_journal_epoch", "cutover.coordinate_succession", "cutover.coordinate_cutover",
            "connector.operate_accountservinggate", "connector.give_dual_approval")
CERTIFIER = ("effects.approve_certification",)
ROLES = {"auditor": (), "operator": OPERATOR, "approver": APPROVER, "certifier": CERTIFIER}


def _perm(label: str) -> Permission:
    app, codename = label.split(".")
    return Permission.objects.get(content_type__app_label=app, codename=codename)


def sync_roles() -> dict[str, int]:
    """Create or update the four groups to exactly their permission lists. Idempotent."""
    base = [_perm("governance.view_governance"),
            *Permission.objects.filter(content_type__app_label__in=VIEW_APPS, codename__startswith="view_")]
    counts = {}
    for name, extra in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = base + [_perm(label) for label in extra]
        group.permissions.set(perms)
        counts[name] = len(perms)
    return counts


def sync_roles_after_migrate(using="default", **kwargs) -> None:
    if using != "default":
        return
    from django.contrib.auth.management import create_permissions
    from django.apps import apps

    for config in apps.get_app_configs():  # permissions of every app exist before the groups point at them
        create_permissions(config, verbosity=0, using=using)
    sync_roles()
