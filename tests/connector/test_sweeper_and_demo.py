"""The sweeper finds due work in PostgreSQL; the demo loader is idempotent."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from connector.actors import Actor
from connector.choices import EpochState
from connector.demo import build_owners
from connector.errors import OwnerUnavailable
from connector.models import AuditRecord, ServingEpoch
from connector.services import serving
from connector.tasks import serving_epoch_sweep

ACTOR = Actor.system("test")


@pytest.mark.django_db
def test_sweeper_verifies_epochs_left_prepared_by_unavailability(settings):
    """A candidate left `prepared` because an owner was unavailable is verified by the next sweep, with no
    broker message involved (the task body runs the service directly). Proves: CV2-02-038"""
    world = build_owners("s-")
    epoch = serving.epoch_prepare_from_owners(epoch_id="s-epoch", actor=ACTOR,
                                              configuration_generation_id=world.configuration.generation_id)
    real = settings.CONNECTOR["SECRET_BACKEND_DIR"]
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": real + "-down"}
    with pytest.raises(OwnerUnavailable):
        serving.epoch_verify(epoch_pk=epoch.pk, actor=ACTOR)
    assert serving_epoch_sweep() == {"verified": [], "rejected": [], "deferred": [epoch.pk]}
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": real}
    assert serving_epoch_sweep() == {"verified": [epoch.pk], "rejected": [], "deferred": []}
    epoch.refresh_from_db()
    assert epoch.state == EpochState.VERIFIED
    assert AuditRecord.objects.get(action="epoch_verify").actor == "system:sweeper"


@pytest.mark.django_db
def test_demo_load_twice_is_safe():
    """`demo_load` creates the world once, prints the operator's credentials, and a second run changes no fact."""
    out = io.StringIO()
    call_command("demo_load", password="first-pass-123", stdout=out)
    assert "Operator login: username 'operator' password 'first-pass-123'" in out.getvalue()
    epochs = list(ServingEpoch.objects.values_list("epoch_id", "state").order_by("epoch_id"))
    assert epochs == [("epoch-1", "active"), ("epoch-2", "verified")]
    audit_rows = AuditRecord.objects.exclude(action__startswith="identity_").count()
    identity_rows = AuditRecord.objects.filter(action__startswith="identity_").count()
    out = io.StringIO()
    call_command("demo_load", password="second-pass-456", stdout=out)
    assert "already loaded" in out.getvalue()
    assert list(ServingEpoch.objects.values_list("epoch_id", "state").order_by("epoch_id")) == epochs
    assert AuditRecord.objects.exclude(action__startswith="identity_").count() == audit_rows
    # the only new rows: the demo users' passwords set again, each in the identity audit (issue 17)
    new = AuditRecord.objects.filter(action__startswith="identity_").order_by("pk")[identity_rows:]
    assert new and {(r.action, r.reason) for r in new} == {
        ("identity_user_change", '{"after": {"password_set": true}, "before": {"password_set": false}}')}
    from django.contrib.auth import authenticate
    assert authenticate(username="operator", password="second-pass-456") is not None
