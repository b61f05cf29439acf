"""The operations CLI (`manage.py delivery`) and the read-only admin of delivery facts."""
from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from effects.delivery.contract import contract
from tests.effects.delivery.world import NAMESPACE, T0


def _run(*args):
    from io import StringIO

    out, err = StringIO(), StringIO()
    code = 0
    try:
        call_command("delivery", *args, stdout=out, stderr=err)
    except SystemExit as exit_:
        code = exit_.code
    return code, out.getvalue(), err.getvalue()


def test_cli_plans_runs_and_exits_with_the_contract_exit_class(world, sync_receiver, tmp_path):
    """plan -> run -> status; a stale re-plan exits with REST_DELIVERY_STALE_GENERATION's exit class (2) and
    prints its evidence schema; an unknown outcome exits 4 and lists under `reconciliations`."""
    spec = {"namespace": NAMESPACE, "parent_key": "cli-1", "binding": world.binding.name, "profile": "sync",
            "route": "orders.daily", "source_boundary": "snap", "receiver_resource_id": "orders",
            "effect_conflict_group": "g1", "scope": [T0.isoformat(), T0.replace(day=2).isoformat()],
            "interval_end": T0.replace(day=2).isoformat(),
            "records": [{"at": T0.replace(hour=h).isoformat(), "id": h} for h in range(3)]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(spec))
    code, out, _ = _run("plan", str(path))
    assert code == 0 and "ADMITTED: 2 children" in out
    code, out, _ = _run("run", "cli-1")
    assert code == 0 and "2/2 final" in out and "final_full_promoted" in out
    path.write_text(json.dumps({**spec, "parent_key": "cli-2", "namespace": {**NAMESPACE, "namespace_revision": 9}}))
    code, _, err = _run("plan", str(path))
    spec_stale = contract().error("REST_DELIVERY_STALE_GENERATION")
    assert code == spec_stale.exit_class == 2
    assert "REST_DELIVERY_STALE_GENERATION" in err and spec_stale.evidence_schema in err
    sync_receiver.queue("error_5xx")
    path.write_text(json.dumps({**spec, "parent_key": "cli-3", "scope": [T0.replace(day=3).isoformat(),
                                                                          T0.replace(day=4).isoformat()],
                                "records": []}))
    assert _run("plan", str(path))[0] == 0
    code, out, err = _run("run", "cli-3")
    assert code == 4 and "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN" in err
    code, out, _ = _run("reconciliations")
    assert "final_unknown_not_accepted" in out and "1 operation(s) wait" in out
    code, out, _ = _run("errors")
    assert out.count("REST_DELIVERY_") == 13


@pytest.mark.django_db(databases=["default", "journal"])
def test_admin_shows_delivery_facts_read_only(world, sync_receiver, admin_client):
    from effects.services.delivery import runner

    parent = world.plan()
    runner.drive_parent(parent.pk)
    op = parent.children.first()
    for url in ("/admin/effects/deliveryparent/", f"/admin/effects/deliveryparent/{parent.pk}/change/",
                "/admin/effects/deliveryoperation/", f"/admin/effects/deliveryoperation/{op.pk}/change/",
                "/admin/effects/receiverbinding/", "/admin/effects/mutationgate/",
                "/admin/effects/deliverywatermark/", "/admin/effects/mayattemptmarker/"):
        response = admin_client.get(url)
        assert response.status_code == 200, url
    page = admin_client.get(f"/admin/effects/deliveryoperation/{op.pk}/change/").content.decode()
    assert "final_full_promoted" in page and "terminal" in page
    assert admin_client.get("/admin/effects/deliveryoperation/add/").status_code == 403
