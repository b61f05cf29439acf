"""The outbound chain is browsable in the admin and operator actions go through the services."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from effects.models import DispatchPermit, OutboundCommand, ProcessGeneration, RemoteEffect, RemoteLink
from tests.effects.test_outbound_flow import test_smoke as run_flow


@pytest.mark.django_db
def test_outbound_facts_render_and_holder_termination_goes_through_the_service(client, push_world, receiver):
    """Every outbound changelist and change page renders read-only; terminating a holder from the admin needs
    evidence and records it. Proves: CV2-10-036 (operator view of the one egress chain)"""
    run_flow(push_world, receiver)
    client.force_login(User.objects.create_superuser("op", password="x"))
    for model in (OutboundCommand, RemoteEffect, DispatchPermit, ProcessGeneration, RemoteLink):
        opts = model._meta
        assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")).status_code == 200
        obj = model.objects.first()
        page = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
        assert page.status_code == 200 and b'name="_save"' not in page.content
    holder = ProcessGeneration.objects.get()
    url = reverse("admin:effects_processgeneration_changelist")
    client.post(url, {"action": "terminate", "_selected_action": [holder.pk], "post": "yes", "reason": ""})
    holder.refresh_from_db()
    assert holder.state == "running"  # no evidence: refused
    client.post(url, {"action": "terminate", "_selected_action": [holder.pk], "post": "yes",
                      "reason": "supervisor stopped generation; egress firewall rule 42"})
    holder.refresh_from_db()
    assert holder.state == "terminated" and "firewall" in holder.termination_evidence
