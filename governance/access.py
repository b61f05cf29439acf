"""What every operator screen shares: the login and view-permission wrapper, and the audit trail of an entity.
Its own module so the screen modules (views, attempts, approvals, console, remediation) import it without
importing each other."""
from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from connector.selectors.rows import AuditRecord

from .forms import FormRefused

VIEW = "governance.view_governance"


def screen(view):
    """Login required, then the view-governance permission (auditors and up). A POST whose form does not
    validate (governance.forms.parse) is answered 400 with its catalog entry; nothing is applied."""
    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.has_perm(VIEW):
            raise PermissionDenied("governance screens need the view_governance permission")
        try:
            return view(request, *args, **kwargs)
        except FormRefused as refused:
            return render(request, "governance/refused.html", {"error": refused.error, "fields": refused.fields},
                          status=refused.error.http_status)
    return wrapped


def audit_trail(entity) -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(entity_type=entity._meta.label, entity_id=str(entity.pk)).order_by("pk"))
