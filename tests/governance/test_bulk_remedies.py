"""Bulk remedies on the board and the queue (issue 38 item 5, D-490..D-493): an operator applies the remedy a reason
allows to many items in one action; each item is decided by its own per-item service (own transaction, guard,
audit row), the page reports each item's outcome, and two operators releasing overlapping sets at once decide
each item exactly once."""
from __future__ import annotations

import re
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connector.selectors.rows import AuditRecord, MaterializationDue
from connector.services import poison
from tests.concurrency import run_concurrently
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import admit, build_inbound_world, webhook_body, webhook_event
from tests.governance.test_remediation_screens import failed_execution, gap_lane  # noqa: F401  (fixtures)
from tests.governance.test_screens import _csrf, client_for
from tests.support import deadline

CODE = "MATERIALIZATION_FAILED"
DONE_ROW = re.compile(r'<tr class="done">\s*<td><a href="/receipts/(\d+)/"')
REFUSED_ROW = re.compile(r'<tr class="refused">\s*<td><a href="/receipts/(\d+)/"[^\n]*\n[^\n]*<code>([A-Z_]+)</code>')


def _held_receipts(prefix: str, n: int, *, accounts: tuple[str, ...] = ("acct-1",)) -> tuple[list[int], list]:
    """`n` receipts admitted through admission and held by the poison quarantine service (as a failing
    materialization holds them), spread over `accounts` round-robin. Returns their pks and the accounts."""
    world = build_inbound_world(prefix, [PACK_A], account_keys=accounts)
    pks = []
    for i in range(n):
        account = world.accounts[i % len(world.accounts)]
        receipt = admit(world, "records.webhook", webhook_body(webhook_event(f"ev-{i}", f"rec-{i}", 1)),
                        account=account)
        assert poison.receipt_hold(ValueError("boom"), receipt_pk=receipt.pk, step="receipt_materialize")
        pks.append(receipt.pk)
    return pks, world.accounts


def _releases(pks) -> dict[str, int]:
    rows = AuditRecord.objects.filter(action="materialization_release", entity_type="connector.Receipt",
                                      entity_id__in=[str(pk) for pk in pks])
    counts: dict[str, int] = {}
    for entity_id in rows.values_list("entity_id", flat=True):
        counts[entity_id] = counts.get(entity_id, 0) + 1
    return counts


def _post(client, items, **fields):
    token = _csrf(client, f"/bulk/?code={CODE}")
    data = {"csrfmiddlewaretoken": token, "code": CODE, "item": [str(pk) for pk in items], **fields}
    return client.post("/bulk/", data)


def _held_receipts(prefix: str, counts: dict[str, int]) -> tuple[dict[str, list[int]], dict]:
    """Receipts admitted through admission and held by the poison quarantine service (as a failing
    materialization holds them): `counts[account key]` of each account. Returns the pks and accounts by key."""
    world = build_inbound_world(prefix, [PACK_A], account_keys=tuple(counts))
    held: dict[str, list[int]] = {}
    for key, account in zip(counts, world.accounts):
        for i in range(counts[key]):
            receipt = admit(world, "records.webhook", webhook_body(webhook_event(f"{key}-ev-{i}", f"rec-{i}", 1)),
                            account=account)
            assert poison.receipt_hold(ValueError("boom"), receipt_pk=receipt.pk, step="receipt_materialize")
            held.setdefault(key, []).append(receipt.pk)
    return held, {key: account for key, account in zip(counts, world.accounts)}


def test_a_bulk_release_of_200_held_receipts_decides_each_once_with_its_audit_row_within_2_s(people):
    """"All 200 of this reason in this account", selected on the bulk page and released in one POST by an operator
    through the real view: the page reports 200 done; each hold is lifted once, with exactly one audit row naming
    the operator and the evidence; none lost or doubled; the other account's held receipts stay held; the page
    answers within 2 s (scaled by the suite's time factor, tests.support)."""
    held, accounts = _held_receipts("bk-", {"acct-1": 200, "acct-2": 3})
    ours, theirs = held["acct-1"], held["acct-2"]
    key = accounts["acct-1"].account_key
    client = client_for(people["operator"])
    page = client.get(f"/bulk/?code={CODE}&account={key}").content.decode()
    ticked = [int(pk) for pk in re.findall(r'name="item" id="item-(\d+)" value="\d+" checked', page)]
    assert sorted(ticked) == sorted(ours), "the page offers exactly the account's 200 items, all ticked"
    assert f"200 items of this reason in account {key}" in page

    clock = deadline(2.0)
    started = time.monotonic()
    with CaptureQueriesContext(connection) as statements:
        response = _post(client, ticked, reason="the fix for the DataError is deployed", evidence_ref="CHG-4711",
                         account=key)
    elapsed = time.monotonic() - started
    body = response.content.decode()
    assert response.status_code == 200, body[:2000]
    done = [int(pk) for pk in DONE_ROW.findall(body)]
    assert sorted(done) == sorted(ours) and len(done) == 200
    assert "What happened: 200 done, 0 refused" in body
    assert not MaterializationDue.objects.filter(receipt_id__in=ours).exclude(held_reason="").exists()
    assert MaterializationDue.objects.filter(receipt_id__in=theirs, held_reason=CODE).count() == 3
    assert _releases(ours) == {str(pk): 1 for pk in ours}, "each item has exactly one release audit row"
    assert _releases(theirs) == {}
    rows = AuditRecord.objects.filter(action="materialization_release", entity_id__in=[str(p) for p in ours])
    assert set(rows.values_list("actor_user_id", flat=True)) == {people["operator"].pk}
    assert all("CHG-4711" in r for r in rows.values_list("reason", flat=True))
    print(f"\nbulk release of 200: {elapsed:.3f} s (deadline {clock.describe()}), {len(statements)} statements "
          f"({len(statements) / 200:.1f} per item)")
    # Pinned (STYLE R27): per item the release's savepoint, receipt lock, hold update, audit insert and release
    # (in production BEGIN/COMMIT instead of the savepoints); the page's own reads are a handful.
    assert len(statements) <= 5 * 200 + 25, len(statements)
    assert elapsed <= clock.seconds, f"200 releases took {elapsed:.2f} s (deadline {clock.describe()})"


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_two_operators_bulk_releasing_overlapping_sets_at_once_decide_each_item_exactly_once(people):
    """Two operators, each on their own connection (threads released together), bulk-release overlapping sets
    (items 0..139 and 60..199 of 200): every item is released exactly once (one audit row), the two done-sets are
    disjoint and cover all 200, and each item the other operator took first is reported refused with
    TRANSITION_REFUSED on the loser's page; no error, no deadlock, nothing left held."""
    from django.contrib.auth.models import Group, User

    pks = _held_receipts("bc-", {"acct-1": 200})[0]["acct-1"]
    second = User.objects.create_user("otto-operator", password="pw-otto")
    second.groups.add(Group.objects.get(name="operator"))
    clients = [client_for(people["operator"]), client_for(User.objects.get(pk=second.pk))]
    tokens = [_csrf(c, f"/bulk/?code={CODE}") for c in clients]
    sets = [pks[:140], pks[60:]]

    def job(i):
        return clients[i].post("/bulk/", {"csrfmiddlewaretoken": tokens[i], "code": CODE,
                                          "item": [str(pk) for pk in sets[i]], "reason": f"fixed ({i})",
                                          "evidence_ref": f"CHG-{i}"})

    started = time.monotonic()
    responses = run_concurrently([lambda: job(0), lambda: job(1)], before=lambda: connection.ensure_connection())
    elapsed = time.monotonic() - started
    assert all(r.status_code == 200 for r in responses)
    bodies = [r.content.decode() for r in responses]
    done = [{int(pk) for pk in DONE_ROW.findall(b)} for b in bodies]
    refused = [dict((int(pk), code) for pk, code in REFUSED_ROW.findall(b)) for b in bodies]
    assert not done[0] & done[1], "no item was released by both"
    assert done[0] | done[1] == set(pks), "every item was released"
    for i in (0, 1):
        assert done[i] | set(refused[i]) == set(sets[i]), "each operator's page reports every item of its set"
        assert set(refused[i].values()) <= {"TRANSITION_REFUSED"}
        assert set(refused[i]) <= done[1 - i], "an item is refused only because the other operator released it"
    assert _releases(pks) == {str(pk): 1 for pk in pks}, "exactly one release audit row per item"
    by = dict(AuditRecord.objects.filter(action="materialization_release").values_list("entity_id", "actor_user_id"))
    assert {int(k) for k, v in by.items() if v == people["operator"].pk} == done[0]
    assert not MaterializationDue.objects.filter(receipt_id__in=pks).exclude(held_reason="").exists()
    print(f"\nconcurrent bulk releases: {len(done[0])} + {len(done[1])} done, "
          f"{len(refused[0])} + {len(refused[1])} refused, {elapsed:.3f} s")


def test_a_refused_bulk_form_keeps_what_was_typed_with_an_error_summary_and_changes_nothing(people):
    """A bulk release with no evidence reference (or nothing ticked) comes back 400 with the typing kept (the
    reason, the ticked boxes), the error beside its field and a summary at the top (GOV.UK pattern); no hold was
    lifted and no audit row written."""
    pks = _held_receipts("bf-", {"acct-1": 3})[0]["acct-1"]
    client = client_for(people["operator"])
    response = _post(client, pks[:2], reason="typed reason stays", evidence_ref="")
    body = response.content.decode()
    assert response.status_code == 400
    assert 'class="error-summary"' in body and '<a href="#evidence_ref">Enter an evidence reference.</a>' in body
    assert 'id="evidence_ref-error"' in body and "typed reason stays</textarea>" in body
    ticked = re.findall(r'name="item" id="item-(\d+)" value="\d+" checked', body)
    assert sorted(int(pk) for pk in ticked) == sorted(pks[:2]), "the boxes stay as they were ticked"
    assert MaterializationDue.objects.filter(receipt_id__in=pks, held_reason=CODE).count() == 3
    assert _releases(pks) == {}
    nothing = _post(client, [], reason="r", evidence_ref="e")
    assert nothing.status_code == 400 and '<a href="#items">Select at least one item.</a>' in nothing.content.decode()
    malformed = _post(client, ["12x"], reason="r", evidence_ref="e")
    assert malformed.status_code == 400 and "FORM_INVALID" in malformed.content.decode()
    unknown = client.get("/bulk/?code=EVENT_KEY_CONFLICT")
    assert unknown.status_code == 400 and "FORM_INVALID" in unknown.content.decode()


def test_an_item_not_held_is_reported_refused_and_the_others_are_released(people):
    """The per-item guard decides: an item released earlier (or a pk that was never held) is refused with
    TRANSITION_REFUSED on the result page and keeps its single audit row; the rest of the set is released."""
    pks = _held_receipts("bn-", {"acct-1": 3})[0]["acct-1"]
    client = client_for(people["operator"])
    first = _post(client, pks[:1], reason="fixed", evidence_ref="CHG-1")
    assert "What happened: 1 done, 0 refused" in first.content.decode()
    again = _post(client, pks + [999_999], reason="fixed", evidence_ref="CHG-2").content.decode()
    assert "What happened: 2 done, 2 refused" in again
    assert dict((int(pk), code) for pk, code in REFUSED_ROW.findall(again)) == {pks[0]: "TRANSITION_REFUSED",
                                                                              999_999: "TRANSITION_REFUSED"}
    assert _releases(pks) == {str(pk): 1 for pk in pks}


def test_only_a_role_with_the_release_permission_sees_the_form_and_a_forged_post_is_403(people):
    """An auditor sees the items but no form; a forged POST is answered 403 and nothing is released. The board and
    the queue offer the bulk remedy of the reason."""
    pks = _held_receipts("bp-", {"acct-1": 2})[0]["acct-1"]
    auditor = client_for(people["auditor"])
    page = auditor.get(f"/bulk/?code={CODE}").content.decode()
    assert "needs governance.release_held_item" in page and "the selected items</button>" not in page
    assert _post(auditor, pks, reason="r", evidence_ref="e").status_code == 403
    assert _releases(pks) == {}
    board = client_for(people["operator"]).get("/board/").content.decode()
    assert 'action="/bulk/" id="bulk-MATERIALIZATION_FAILED"' in board
    assert all(f'name="pk" value="{pk}"' in board for pk in pks)
    queue = client_for(people["operator"]).get("/queue/").content.decode()
    assert f'href="/bulk/?code={CODE}">Release the 2 items of <code>{CODE}</code></a>' in queue
    chosen = client_for(people["operator"]).get(f"/bulk/?code={CODE}&pk={pks[1]}").content.decode()
    assert re.findall(r'name="item" id="item-(\d+)" value="\d+" checked', chosen) == [str(pks[1])]


def test_the_command_releases_every_item_of_one_reason_in_one_account_with_progress(people, capsys):
    """`manage.py poison_release --code CODE --account KEY --all --reason TEXT` releases each held item of that
    account through the per-item service (one audit row each), printing one progress line per item; the other
    account's items stay held. Without --all it refuses and changes nothing."""
    held, accounts = _held_receipts("bm-", {"acct-1": 3, "acct-2": 1})
    key = accounts["acct-1"].account_key
    with pytest.raises(CommandError, match="--all"):
        call_command("poison_release", code=CODE, account=key, reason="fixed")
    assert _releases(held["acct-1"]) == {}
    call_command("poison_release", code=CODE, account=key, all=True, reason="fixed", operator="oscar")
    out = capsys.readouterr().out
    assert f"3 receipt(s) held with {CODE} of account {key}" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith("[")] == ["[1/3]", "[2/3]", "[3/3]"]
    assert "3 released, 0 refused" in out
    assert _releases(held["acct-1"]) == {str(pk): 1 for pk in held["acct-1"]}
    assert MaterializationDue.objects.filter(receipt_id__in=held["acct-2"], held_reason=CODE).count() == 1


def test_a_bulk_resume_carries_each_lane_s_shown_fence_and_a_stale_one_is_refused_alone(people, gap_lane):
    """GAP_DEADLINE allows `resume`: the bulk page shows each lane with its fence; an item posted with a fence
    the lane has left is refused FENCE_STALE by lane_resume's own guard (nothing written), and the same lane
    posted with the fence the page shows is resumed, with its LaneResumption and audit row."""
    from connector.models import LaneResumption, OrderingLane

    client = client_for(people["operator"])
    page = client.get("/bulk/?code=GAP_DEADLINE").content.decode()
    assert f'value="{gap_lane.pk}|{gap_lane.fence}" checked' in page
    token = _csrf(client, "/bulk/?code=GAP_DEADLINE")
    form = {"csrfmiddlewaretoken": token, "code": "GAP_DEADLINE", "mode": "missing_arrived", "reason": "2 arrived",
            "evidence_ref": "T-3"}
    stale = client.post("/bulk/", {**form, "item": [f"{gap_lane.pk}|{gap_lane.fence - 1}"]}).content.decode()
    assert "What happened: 0 done, 1 refused" in stale and "<code>FENCE_STALE</code>" in stale
    assert OrderingLane.objects.get(pk=gap_lane.pk).state == "halted" and not LaneResumption.objects.exists()
    done = client.post("/bulk/", {**form, "item": [f"{gap_lane.pk}|{gap_lane.fence}"]}).content.decode()
    assert "What happened: 1 done, 0 refused" in done and "resumed (missing_arrived)" in done
    assert OrderingLane.objects.get(pk=gap_lane.pk).state == "open" and LaneResumption.objects.count() == 1
    missing = client.post("/bulk/", {**form, "mode": "", "item": [f"{gap_lane.pk}|{gap_lane.fence}"]})
    assert missing.status_code == 400 and "Choose missing_arrived or skip_with_evidence." in missing.content.decode()


def test_a_bulk_replay_goes_through_execution_replay_with_the_shown_change_time(people, failed_execution):
    """RESULT_FAILED allows `replay` (retry): an auditor cannot post it (403); the operator's bulk replay admits one
    ReplayRequest per execution through execution_replay, guarded by the change time the page showed."""
    from connector.models import ReplayRequest

    shown = f"{failed_execution.pk}|{failed_execution.changed_at.isoformat()}"
    operator = client_for(people["operator"])
    assert f'value="{shown}" checked' in operator.get("/bulk/?code=RESULT_FAILED").content.decode()
    auditor = client_for(people["auditor"])
    token = _csrf(auditor, "/bulk/?code=RESULT_FAILED")
    form = {"code": "RESULT_FAILED", "reason": "runtime fixed", "evidence_ref": "T-4", "item": [shown]}
    assert auditor.post("/bulk/", {**form, "csrfmiddlewaretoken": token}).status_code == 403
    assert not ReplayRequest.objects.exists()
    token = _csrf(operator, "/bulk/?code=RESULT_FAILED")
    body = operator.post("/bulk/", {**form, "csrfmiddlewaretoken": token}).content.decode()
    assert "What happened: 1 done, 0 refused" in body
    assert ReplayRequest.objects.get().principal == "user:oscar-operator"


def test_a_bulk_new_remote_call_authorizes_one_successor_per_effect_through_the_intent_service(people, push_world,
                                                                                                 receiver):
    """NO_EFFECT_ATTEMPTS_SPENT allows a new remote call (retry): the bulk page carries the effect's change time,
    and the POST authorizes one successor through remote_call_for_effect (the same intent ID as the effect page
    would derive, so posting the page twice mints one intent); the effect then leaves the list."""
    from effects.models import RemoteCallIntent, RemoteEffect
    from tests.effects.test_remote_call_intent import _runtime_no_effect

    command = _runtime_no_effect(push_world.accounts[0], receiver)
    effect = RemoteEffect.objects.get(command=command)
    code = effect.quarantine_reason
    shown = f"{effect.pk}|{effect.changed_at.isoformat()}"
    client = client_for(people["operator"])
    assert f'value="{shown}" checked' in client.get(f"/bulk/?code={code}").content.decode()
    token = _csrf(client, f"/bulk/?code={code}")
    form = {"csrfmiddlewaretoken": token, "code": code, "reason": "receiver fixed", "evidence_ref": "T-9",
            "item": [shown]}
    for _ in range(2):
        body = client.post("/bulk/", form).content.decode()
        assert "What happened: 1 done, 0 refused" in body and "(successor)" in body
    assert RemoteCallIntent.objects.count() == 1
    assert RemoteCallIntent.objects.get().principal == "user:oscar-operator"
    assert "Nothing of this reason waits" in client.get(f"/bulk/?code={code}").content.decode()
