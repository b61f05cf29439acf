"""The demo world serves both ordering contracts (D-196): `demo_load` installs the latest-position channel and the
strict-sequence channel with a short frozen gap deadline, and two approvers for identity changes."""
from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from connector.models import ConnectorAccount, ServingEpoch
from connector.selectors.routes import route_for


@pytest.mark.django_db(databases=["default", "journal"])
def test_demo_load_serves_a_latest_position_and_a_strict_sequence_channel():
    out = io.StringIO()
    call_command("demo_load", password="pw-demo-1", stdout=out)
    assert "inbound channels: records.sequenced, records.webhook" in out.getvalue()
    epoch = ServingEpoch.objects.get(epoch_id="epoch-1")
    account = ConnectorAccount.objects.get(account_key="acme-eu")
    latest = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=account.pk,
                       channel="records.webhook")
    strict = route_for(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), account_id=account.pk,
                       channel="records.sequenced")
    assert latest.contract == "latest_source_position"
    assert strict.contract == "strict_source_sequence"
    assert (strict.ordering["gap_deadline_seconds"], strict.ordering["gap_disposition"],
            strict.ordering["first_position"]) == (30, "quarantine_partition", 1)
    assert strict.definition["push"] == latest.definition["push"]
    approvers = set(User.objects.filter(groups__name="approver").values_list("username", flat=True))
    assert approvers == {"alma", "abe"}
