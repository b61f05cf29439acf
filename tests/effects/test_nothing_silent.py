"""Nothing silent (issue 38 item 6, D-481, D-482): an effect that ends without its remote change carries a closed
reason code, is on the quarantine board (and in the approval queue) with its remedy, and is counted in /metrics.
End to end on real PostgreSQL through the sole egress adapter against a real HTTP receiver on loopback."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from effects.models import RemoteEffect, RemoteLink
from governance import selectors
from tests.effects.test_remote_identity import dispatch, push

CODE = "LINKED_RECORD_NOT_FOUND"


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the /metrics text (0 when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.django_db
def test_a_404_to_an_update_of_a_linked_record_ends_with_its_reason_on_the_board_and_in_metrics(
        push_world, receiver, django_capture_on_commit_callbacks):
    """Record r1 is created and linked; its next update is addressed at the linked identity (PATCH .../by-id/<id>)
    and the receiver answers 404 to every attempt. The policy's attempts are spent (max_attempts, each refusal
    counted) and the effect ends `no_effect` with LINKED_RECORD_NOT_FOUND, not silently: the board groups it under
    that code with its remedy (a new remote call, on the effect page), the approval queue lists it, the board and
    effect pages show code, title and remedy, and /metrics counts it in `connector_effects_no_effect_total` and
    `connector_quarantined_items`. A create refused the same way keeps the generic NO_EFFECT_ATTEMPTS_SPENT.
    Proves: issue 38 item 6"""
    account = push_world.accounts[0]
    metrics = Client().get("/metrics").content.decode()
    before = _metric(metrics, "connector_effects_no_effect_total", reason=CODE)
    push(account, "r1", 1)
    assert dispatch(account).state == "finalized"
    link = RemoteLink.objects.get(owner_slot="r1")
    push(account, "r1", 2)
    receiver.default_mode = "gone"
    with django_capture_on_commit_callbacks(execute=True):
        ended = [dispatch(account) for _ in range(3)]
    assert [e.state for e in ended] == ["prepared", "prepared", "no_effect"]
    effect = RemoteEffect.objects.get(pk=ended[-1].pk)
    assert (effect.state, effect.quarantine_reason) == ("no_effect", CODE)
    assert [(r["method"], r["path"], r["mode"]) for r in receiver.requests[1:]] == (
        [("PATCH", f"/v1/records/by-id/{link.remote_identity}", "gone")] * 3)

    board = selectors.board()
    assert [i.pk for i in board[CODE]] == [effect.pk]
    item = board[CODE][0]
    assert item.remedy.kind == "remote_call" and item.remedy.queue
    assert [i.pk for i in selectors.queue() if i.code == CODE] == [effect.pk]

    page = Client()
    page.force_login(User.objects.create_superuser("ops-silent", password="pw"))
    shown = page.get("/board/").content.decode()
    assert f"<code>{CODE}</code>" in shown and "answered 404 to an update of the linked" in shown
    assert f"/queue/effect/{effect.pk}/" in shown and "authorize a new remote call" in shown
    shown = page.get(f"/queue/effect/{effect.pk}/").content.decode()
    assert CODE in shown and "Authorize a new remote call" in shown

    metrics = page.get("/metrics").content.decode()
    assert _metric(metrics, "connector_effects_no_effect_total", reason=CODE) == before + 1
    assert _metric(metrics, "connector_quarantined_items", kind="effect", reason=CODE) == 1


@pytest.mark.django_db
def test_a_create_answered_404_keeps_the_generic_reason(push_world, receiver):
    """A 404 to a create (no RemoteLink addressed) names a missing route, not a missing record: the effect ends
    NO_EFFECT_ATTEMPTS_SPENT. Proves: issue 38 item 6"""
    account = push_world.accounts[0]
    push(account, "r2", 1)
    receiver.default_mode = "gone"
    ended = [dispatch(account) for _ in range(3)]
    assert (ended[-1].state, ended[-1].quarantine_reason) == ("no_effect", "NO_EFFECT_ATTEMPTS_SPENT")
