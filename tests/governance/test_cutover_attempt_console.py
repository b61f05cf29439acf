"""The cutover console for a V1 -> V2 service cutover: the phases in order with receipts, blockers and actions run
through the same dispatch as `manage.py cutover`; interrupted V1 effects appear in the approval queue and are
reconciled on the page with evidence; a stale page and a user without the permission are refused."""
from __future__ import annotations

import re

import pytest
from django.db import connections

from connector.choices import GateMode
from cutover.models import V1Reconciliation
from cutover.ports import v1_owner
from cutover.services import v1_shutdown as sd
from tests.cutover.approval_helpers import approve
from tests.cutover.v1_world import ACTOR, BUDGETS, build_v1_world
from tests.crash.conftest import child_env, run_child  # noqa: F401 (fixtures)
from tests.governance.test_screens import _csrf, client_for
from tests.support import whole_seconds

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)


@pytest.fixture(autouse=True)
def env(settings, tmp_path):
    from tests.effects.receiver import Receiver

    v1_owner.cache_clear()
    settings.CUTOVER_RESTORE_POINT_DIR = str(tmp_path / "restore-points")
    receiver = Receiver().start()
    settings.CONNECTOR = {**settings.CONNECTOR,
                          "EGRESS_BASE_URL": receiver.url, "EGRESS_TIMEOUT_SECONDS": whole_seconds(1)}
    yield receiver
    receiver.stop()
    connections.close_all()


def _token(html: str) -> str:
    return re.search(r'name="token" value="([0-9a-f]+)"', html).group(1)


def _post(client, url, **data):
    csrf = _csrf(client, url)
    return client.post(url, {"csrfmiddlewaretoken": csrf, **data}, follow=True)


@TX
def test_an_approver_walks_the_v1_phases_and_reconciles_an_interrupted_effect(people, run_child):
    """From the console: close the barriers, stop V1 (a worker was killed mid-call), see the interrupted V1 effect
    in the queue and reconcile it with evidence on the page, export and certify the shutdown. A stale page is
    refused; a user without the permission sees no action and a forged POST gets 403. Proves: CV2-12-041,
    CV2-12-042, CV2-13-007 (issue: V1 rows in v1_stopped reconciliation on the approval queue)"""
    world = build_v1_world("gv-")
    world.accept(0, "k1", 1)
    sd.cutover_open(attempt_key="web-1", configuration_generation_id=world.configuration.generation_id,
                    candidate_epoch_id=world.epoch.epoch_id, actor=ACTOR)
    sd.cutover_certify(attempt_key="web-1", budgets=BUDGETS, actor=ACTOR)
    approve("readiness_certificate", "web-1")
    client = client_for(people["approver"])
    url = "/cutover/attempt/web-1/"
    assert url in client.get("/cutover/").content.decode()
    page = client.get(url).content.decode()
    stale = _token(page)
    assert "Close the owner barriers" in page
    response = _post(client, url, action="close", token=stale)
    assert "msg error" not in response.content.decode() and world.modes() == {GateMode.HALTING_V1}
    response = _post(client, url, action="stop", token=stale)
    assert "Refused: the attempt changed" in response.content.decode()
    assert world.modes() == {GateMode.HALTING_V1}

    child = run_child("""
        from v1 import runtime
        runtime.drain(ARGS["generation"])
    """, "v1.after_dispatching", generation=world.generation_id)
    assert child.killed
    page = client.get(url).content.decode()
    response = _post(client, url, action="stop", token=_token(page))
    assert world.modes() == {GateMode.V1_STOPPED}, response.content.decode()[:2000]
    queue = client.get("/queue/").content.decode()
    assert "V1_IO_MAY_HAVE_STARTED" in queue and "#ph-reconcile" in queue

    viewer = client_for(people["operator"])
    assert "Reconcile</button>" not in viewer.get(url).content.decode()
    forged = viewer.post(url, {"csrfmiddlewaretoken": _csrf(viewer, url), "action": "export",
                               "token": _token(page)})
    assert forged.status_code == 403

    page = client.get(url).content.decode()
    effect_id = re.search(r'name="effect" value="(\d+)"', page).group(1)
    _post(client, url, action="reconcile", token=_token(page), effect=effect_id, outcome="no_effect",
          evidence="provider ledger: no request with this key", reason="checked with the provider")
    assert V1Reconciliation.objects.filter(effect_row_id=effect_id, outcome="no_effect").exists()
    assert "V1_IO_MAY_HAVE_STARTED" not in client.get("/queue/").content.decode()
    for action in ("export", "certify_drained"):
        page = client.get(url).content.decode()
        response = _post(client, url, action=action, token=_token(page))
        assert "msg error" not in response.content.decode(), response.content.decode()[:3000]
    assert world.modes() == {GateMode.V1_DRAINED}
    assert re.findall(r'class="phase phase-(\w+)"', client.get(url).content.decode())[:5] == ["done"] * 5
