"""Every operator decision carries the exact state it was made on and the service requires it (issue 17): a
decision form with its state token removed, a malformed token, or an admin confirmation page opened before the
effect moved is refused with a closed code and changes nothing; malformed form values are a 400 with the error
catalog, never a 500."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from connector.actors import Actor
from connector.errors import StateTokenInvalid
from effects.models import RemoteEffect
from effects.services import dispatch, worker
from tests.governance.test_screens import _csrf, client_for, uncertain  # noqa: F401  (fixture)


def _effect(pk: int) -> RemoteEffect:
    return RemoteEffect.objects.get(pk=pk)


def test_a_stale_decision_with_its_state_token_removed_is_refused(people, uncertain, push_world):  # noqa: F811
    """The page was shown, the effect moved on (reconciled, retried, uncertain again), and the old form is
    re-posted without `changed_at`: refused with STATE_TOKEN_INVALID (400); the effect stays as it is.
    Proves: issue 17 item 1; CV2-10-023..029 (a reconciliation applies to the state it was decided on)."""
    op = client_for(people["operator"])
    url = f"/queue/effect/{uncertain.pk}/"
    csrf = _csrf(op, url)
    dispatch.effect_reconcile(effect_pk=uncertain.pk, decision="no_effect", actor=Actor.for_user(people["operator"]),
                              evidence="provider says no", expected_changed_at=uncertain.changed_at)
    again = worker.effect_dispatch_once(holder_name="h-gov-2", account_id=push_world.accounts[0].pk)
    assert again.pk == uncertain.pk and again.state == "uncertain"
    moved = _effect(uncertain.pk)
    response = op.post(url, {"csrfmiddlewaretoken": csrf, "decision": "quarantine", "reason": "stale page",
                             "evidence_ref": "T-1"})
    assert response.status_code == 400
    assert "STATE_TOKEN_INVALID" in response.content.decode()
    after = _effect(uncertain.pk)
    assert (after.state, after.changed_at) == ("uncertain", moved.changed_at)


@pytest.mark.parametrize("token", ["2026-13-45T99:00:00", "yesterday", "2026-12-01T10:00:00", " "])
def test_a_malformed_state_token_is_a_400_with_the_catalog_never_a_500(people, uncertain, token):  # noqa: F811
    """A malformed timestamp (month 13, not a timestamp, no UTC offset, blank) is answered 400 naming
    STATE_TOKEN_INVALID and its operator action; nothing is applied. Proves: issue 17 item 5."""
    op = client_for(people["operator"])
    url = f"/queue/effect/{uncertain.pk}/"
    response = op.post(url, {"csrfmiddlewaretoken": _csrf(op, url), "decision": "quarantine", "reason": "r",
                             "evidence_ref": "e", "changed_at": token})
    page = response.content.decode()
    assert response.status_code == 400 and "STATE_TOKEN_INVALID" in page and "Reload the page" in page
    assert _effect(uncertain.pk).state == "uncertain"


def test_malformed_values_on_every_decision_form_are_400s(people, uncertain):  # noqa: F811
    """Each screen's POST is parsed by one validated form: a bad choice, a non-integer revision or fence, a
    non-hex digest, a bad approval kind are each a 400 with a catalog code (FORM_INVALID or
    STATE_TOKEN_INVALID), never a 500. Proves: issue 17 item 5."""
    from django.test import Client

    admin = User.objects.create_superuser("root-forms", password="pw")
    client = Client()
    client.force_login(admin)
    cases = [
        (f"/queue/effect/{uncertain.pk}/", {"decision": "delete_everything", "reason": "r", "evidence_ref": "e",
                                            "changed_at": uncertain.changed_at.isoformat()}, "FORM_INVALID"),
        ("/queue/delivery/1/", {}, None),  # no such operation: 404 before any parse
        ("/attestations/certification/1/", {}, None),
        ("/attestations/request/", {"kind": "anything", "subject_key": "x"}, "FORM_INVALID"),
    ]
    for url, data, code in cases:
        response = client.post(url, data)
        if code is None:
            assert response.status_code == 404, url
        else:
            assert response.status_code == 400 and code in response.content.decode(), url


def test_the_service_refuses_a_decision_without_a_state_token(people, uncertain):  # noqa: F811
    """effect_reconcile has no "no check" mode: a missing token raises STATE_TOKEN_INVALID before anything is
    read or written. Proves: issue 17 item 1."""
    with pytest.raises(StateTokenInvalid):
        dispatch.effect_reconcile(effect_pk=uncertain.pk, decision="quarantine", evidence="e",
                                  actor=Actor.for_user(people["operator"]), expected_changed_at=None)
    assert _effect(uncertain.pk).state == "uncertain"


def test_the_admin_action_on_a_moved_effect_is_refused(people, uncertain, push_world):  # noqa: F811
    """The admin's reconcile action uses the same service and token: a confirmation page opened before the effect
    moved, posted afterwards, is refused and the effect is not quarantined; a confirmation whose token is
    removed is refused too; a fresh confirmation applies. Proves: issue 17 item 1."""
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("root-admin", password="pw"))
    url = reverse("admin:effects_remoteeffect_changelist")
    confirm = client.post(url, {"action": "reconcile_quarantine", "_selected_action": [uncertain.pk]})
    assert confirm.status_code == 200
    shown = confirm.context["rows"][0]["token"]
    assert f'name="token_{uncertain.pk}"' in confirm.content.decode()

    dispatch.effect_reconcile(effect_pk=uncertain.pk, decision="no_effect", actor=Actor.for_user(people["operator"]),
                              evidence="provider says no", expected_changed_at=uncertain.changed_at)
    assert worker.effect_dispatch_once(holder_name="h-adm", account_id=push_world.accounts[0].pk).state == "uncertain"
    moved = _effect(uncertain.pk)

    post = {"action": "reconcile_quarantine", "_selected_action": [uncertain.pk], "post": "yes",
            "reason": "quarantine from a stale page"}
    page = client.post(url, {**post, f"token_{uncertain.pk}": shown}, follow=True).content.decode()
    assert "RECONCILE_REFUSED" in page and "changed since the page was shown" in page
    page = client.post(url, post, follow=True).content.decode()
    assert "STATE_TOKEN_INVALID" in page
    assert (_effect(uncertain.pk).state, _effect(uncertain.pk).changed_at) == ("uncertain", moved.changed_at)

    fresh = client.post(url, {"action": "reconcile_quarantine", "_selected_action": [uncertain.pk]})
    client.post(url, {**post, f"token_{uncertain.pk}": fresh.context["rows"][0]["token"]})
    assert _effect(uncertain.pk).state == "quarantined"
