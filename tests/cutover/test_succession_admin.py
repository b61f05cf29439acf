"""The succession facts are browsable read-only in the admin."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from cutover.models import OrderingHandoff, ServingPublicationBarrierSet
from tests.cutover.succession_helpers import build_succession_world, drain, halt_all, handoff_all, held_barrier, send


@pytest.mark.django_db
def test_barrier_sets_and_handoffs_render_read_only(client):
    """Changelists and change pages of ServingPublicationBarrierSet and OrderingHandoff render, with no add,
    change or delete. Proves: CV2-11-033"""
    world = build_succession_world("sm-")
    send(world, "evt-100", 100)
    drain()
    halt_all(world)
    barrier = held_barrier(world)
    handoff, = handoff_all(world, barrier)
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "unused"))
    for model, obj in ((ServingPublicationBarrierSet, barrier), (OrderingHandoff, handoff)):
        label = f"admin:cutover_{model._meta.model_name}"
        listing = client.get(reverse(f"{label}_changelist"))
        assert listing.status_code == 200 and 'class="cv2-description"' in listing.content.decode()
        page = client.get(reverse(f"{label}_change", args=[obj.pk]))
        assert page.status_code == 200
        assert client.get(reverse(f"{label}_add")).status_code == 403
    assert "held" in client.get(reverse("admin:cutover_servingpublicationbarrierset_change",
                                        args=[barrier.pk])).content.decode()


def test_the_handoff_lane_halt_reason_is_in_the_closed_reason_map():
    """A lane frozen by a handoff carries halt reason ORDERING_HANDOFF, which the operator board maps (never
    UNMAPPED). Proves: CV2-11-014"""
    from cutover.services.succession import HANDOFF_HALT_REASON
    from governance.reasons import reason

    assert reason(HANDOFF_HALT_REASON).code == HANDOFF_HALT_REASON
