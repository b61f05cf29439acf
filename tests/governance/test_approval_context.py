"""Approvers decide with the facts in front of them (issue 38): the delivery page's five axes, the approval page's
subject, before/after, requester's reason and evidence, a refusal that needs a reason and ends the request, a
finished relink that reads as finished, every request kind filed where the attestations screen says, and the
cutover console's request form with a reason and evidence and words for who may act."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User

from tests.governance.test_screens import client_for, delivery_world  # noqa: F401  (fixture)


def _approver(name):
    user = User.objects.create_user(name)
    user.groups.add(Group.objects.get(name="approver"))
    return User.objects.get(pk=user.pk)


def test_the_delivery_page_shows_the_five_axes(people, delivery_world):  # noqa: F811
    """The "Five axes" table has its five names and, under them, five values (the values row was empty: the view
    handed the template a zip iterator, and the second loop over it found nothing). Proves: issue 38 item 1"""
    from effects.delivery.contract import contract
    from effects.services.delivery import runner

    world, _ = delivery_world
    parent = world.plan()
    runner.drive_parent(parent.pk)
    op = parent.children.first()
    op = type(op).objects.get(pk=op.pk)
    page = client_for(people["auditor"]).get(f"/queue/delivery/{op.pk}/").content.decode()
    axes = page.split("<h2>Five axes</h2>", 1)[1].split("</table>", 1)[0]
    assert "<tr></tr>" not in axes
    values = re.findall(r'<td><span class="badge">([^<]*)</span></td>', axes)
    assert values == [str(v) for v in contract().tuples[op.state]] and len(values) == 5
