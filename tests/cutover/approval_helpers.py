"""Dual approval in cutover tests: a requester and two approvers (each a fresh user in the approver role) approve
the subject's current digest."""
from __future__ import annotations

import itertools

from connector.actors import Actor

_people = itertools.count(1)


def approve(kind: str, subject_key: str) -> None:
    from django.contrib.auth.models import Group, User

    from connector.services import approvals

    group = Group.objects.get(name="approver")
    people = []
    for role in ("requester", "approver-a", "approver-b"):
        user = User.objects.create_user(f"{role}-{next(_people)}")
        user.groups.add(group)
        people.append(Actor.for_user(User.objects.get(pk=user.pk)))
    request = approvals.approval_request(kind=kind, subject_key=subject_key, actor=people[0],
                                         reason="the cutover step is due", evidence_ref="test")
    for approver in people[1:]:
        approvals.approval_give(request_pk=request.pk, digest_seen=bytes(request.subject_digest), actor=approver)
