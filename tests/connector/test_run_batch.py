"""The batched Runtime and the batched result recording (issue 18 goal 3; D-254..D-256): a claimed batch runs through
one Runtime transaction and one fenced completion transaction, with exactly the outcomes, results, receipts,
audit rows and lane high-waters of the per-item path, which keeps everything unusual. On real PostgreSQL."""
from __future__ import annotations

import hashlib

import pytest

from connector.canonical.encoding import encode
from connector.choices import GateMode
from connector.interpreters.inbound import RouteProgram
from connector.models import (
    AccountServingGate,
    ApplicationResult,
    AuditRecord,
    CrmRecord,
    Execution,
    OrderingLane,
)
from connector.receipts import rec
from connector.services import claims, execution, gates, runtime
from tests.concurrency import raised, run_concurrently
from tests.conformance.packs import PACK_A
from tests.connector.inbound_helpers import ACTOR, advance_lanes, build_inbound_world, deliver, webhook_body, \
    webhook_event


@pytest.fixture(autouse=True)
def _fresh_rotation():
    claims._ROTATION["start"] = 0


@pytest.fixture
def two_accounts(transactional_db):
    return build_inbound_world("rb-", [PACK_A], account_keys=("acct-1", "acct-2"))


def _deliver(world, account, events) -> list[Execution]:
    deliver(world, "records.webhook", webhook_body(*events), account=account)
    return advance_lanes()


def _no_per_item(monkeypatch):
    """Fail the test if any Execution of the batch took the per-item step."""
    def refuse(**kwargs):
        raise AssertionError(f"per-item path taken for {kwargs}")
    monkeypatch.setattr(execution, "execution_run", refuse)


def _per_item(*, account_ids: list[int]) -> list[Execution]:
    """The per-item step (`execution._run_one`: what the batch path leaves, and a traced step) for every Execution
    of a claimed batch: the reference the batch path is compared with."""
    return [execution._run_one(t) for t in execution.execution_claim_batch(holder="w", n=10, account_ids=account_ids)]


def _expected_result(command_id: str, ref_digest: bytes, outcome: str) -> tuple[bytes, bytes]:
    """The per-command path's result digest and receipt for a one-item command (runtime_command_apply), restated."""
    digest = hashlib.sha256(encode(runtime.RESULT_RECEIPT_PROTOCOL + "/result", rec(
        command_id=command_id, outcome=outcome, items=[outcome]))).digest()
    receipt = encode(runtime.RESULT_RECEIPT_PROTOCOL, rec(command_id=command_id, execution_ref_digest=ref_digest,
                                                          outcome=outcome, result_digest=digest))
    return digest, receipt


def _state(account) -> dict:
    """Everything the run wrote for one account, by record key, without identities (command IDs, pks, times)."""
    out = {}
    for e in Execution.objects.filter(account=account).select_related("projection", "lane").order_by("pk"):
        key = e.lane.partition
        result = ApplicationResult.objects.filter(command_id=e.command_id).first()
        audit = list(AuditRecord.objects.filter(entity_type="connector.Execution", entity_id=str(e.pk))
                     .values_list("actor", "action", "from_state", "to_state", "fence", "reason"))
        lane = OrderingLane.objects.get(pk=e.lane_id)
        record = CrmRecord.objects.filter(account=account, record_key=key).first()
        if result is not None:
            digest, receipt = _expected_result(e.command_id, bytes(e.execution_ref_digest), result.outcome)
            assert (bytes(result.result_digest), bytes(result.receipt)) == (digest, receipt)
            assert bytes(result.execution_ref_digest) == bytes(e.execution_ref_digest)
            assert (bytes(e.result_digest), bytes(e.runtime_receipt)) == (digest, receipt)
            assert AuditRecord.objects.get(entity_type="connector.Execution", entity_id=str(e.pk),
                                           action="execution_record_result").evidence_digest == digest
        out.setdefault(key, []).append({
            "execution": (e.state, e.result_outcome, e.quarantine_reason, e.lease_holder, e.lease_expires_at,
                          e.attempt_count),
            "result": result and (result.outcome, result.detail),
            "audit": audit,
            "lane": (lane.high_water, lane.high_water_tie and bytes(lane.high_water_tie), lane.active_execution_id,
                     lane.state, lane.halt_reason, lane.fence),
            "record": record and (record.fields, record.version, record.last_command_id == e.command_id),
        })
    return out


def _round(world, account, n: int, tag: str, sequence: int, names: dict[str, str]) -> None:
    _deliver(world, account, [webhook_event(f"{tag}-{r}", r, sequence, full_name=name,
                                            mail="nomail" if r == "r4" else f"{r}@example.test")
                              for r, name in names.items()])


@pytest.mark.parametrize("quarantine_rejected", [False, True])
def test_batch_run_writes_exactly_what_the_per_item_path_writes(two_accounts, monkeypatch,
                                                               quarantine_rejected):
    """The same deliveries to two accounts; account 1 runs through the batch path (no Execution takes the
    per-item step), account 2 through the per-item step (`execution._run_one`, each claimed Execution alone). Over two rounds (new records, a
    rejected email, then an unchanged record = noop and a changed one = version 2) every Execution, its
    ApplicationResult (outcome, detail, the per-command result digest and receipt), its audit row, its lane
    (high-water, tie, fence, halt) and the CRM records are the same. With a route that quarantines `rejected`,
    the quarantine halts the lane the same way.
    Proves: CV2-08-005, CV2-08-008, CV2-07-015, CV2-06-014, CV2-14-001"""
    if quarantine_rejected:
        original = RouteProgram.terminal_disposition
        monkeypatch.setattr(RouteProgram, "terminal_disposition",
                            lambda self, outcome: "quarantine" if outcome == "rejected" else original(self, outcome))
    batch_acct, item_acct = two_accounts.accounts
    rounds = [{"r1": "Ada", "r2": "Bob", "r3": "Cy", "r4": "Dee"}, {"r1": "Ada", "r2": "Bobby"}]
    for i, names in enumerate(rounds, start=1):
        for account in (batch_acct, item_acct):
            _round(two_accounts, account, len(names), f"round{i}", i, names)
        with monkeypatch.context() as m:
            _no_per_item(m)
            done = execution.execution_claim_batch_and_run(holder="w", n=10, account_ids=[batch_acct.pk])
        assert len(done) == len(names)
        assert len(_per_item(account_ids=[item_acct.pk])) == len(names)
    batch_state, item_state = _state(batch_acct), _state(item_acct)
    assert batch_state == item_state
    assert batch_state["r2"][-1]["record"][1] == 2 and batch_state["r1"][-1]["result"] == ("noop", "noop")
    assert batch_state["r4"][0]["result"] == ("rejected", "rejected")
    assert batch_state["r4"][0]["execution"][0] == ("quarantined" if quarantine_rejected else "completed")


def test_a_stale_lease_in_the_batch_is_not_completed(two_accounts, monkeypatch):
    """Between the claim and the run, one Execution's lease is taken over (fence + 1, another holder): the batch
    never applies or completes it (the per-item step refuses it with FENCE_STALE before Runtime), and
    completes the others; the newer holder then completes it with the one ApplicationResult.
    Proves: CV2-07-018, CV2-07-017, CV2-07-016"""
    acct = two_accounts.accounts[0]
    minted = _deliver(two_accounts, acct, [webhook_event(f"s-{i}", f"s{i}", 1) for i in range(3)])
    tokens = execution.execution_claim_batch(holder="a", n=10, lease_seconds=60)
    assert len(tokens) == 3
    stolen = tokens[1]
    Execution.objects.filter(pk=stolen.execution_pk).update(lease_fence=stolen.lease_fence + 1, lease_holder="b")
    done = execution.execution_run_batch(tokens=tokens)
    by_pk = {e.pk: e for e in done}
    assert [e.pk for e in done] == [t.execution_pk for t in tokens]
    assert by_pk[stolen.execution_pk].state == "ready"
    assert {by_pk[t.execution_pk].state for t in tokens if t is not stolen} == {"completed"}
    stolen_cmd = Execution.objects.get(pk=stolen.execution_pk).command_id
    assert not ApplicationResult.objects.filter(command_id=stolen_cmd).exists()
    newer = execution.ClaimToken(stolen.execution_pk, stolen.lease_fence + 1, "b")
    assert execution.execution_run(token=newer).state == "completed"
    assert ApplicationResult.objects.count() == 3 == len(minted)


def test_a_stale_fence_after_runtime_is_refused_under_the_row_lock(two_accounts):
    """The lease is taken over after the batch's Runtime transaction committed (the run raced past the first
    check): `execution_record_results` compares the fence under the Execution's row lock and leaves it ready;
    the per-item recording with the stale fence raises FENCE_STALE. Proves: CV2-07-018, CV2-08-011"""
    acct = two_accounts.accounts[0]
    _deliver(two_accounts, acct, [webhook_event("t-1", "t1", 1), webhook_event("t-2", "t2", 1)])
    tokens = execution.execution_claim_batch(holder="a", n=10, lease_seconds=60)
    rows = {e.pk: e for e in Execution.objects.select_related("projection").filter(pk__in=[t.execution_pk
                                                                                           for t in tokens])}
    receipts = runtime.runtime_commands_apply(commands=[runtime.RuntimeCommand(
        rows[t.execution_pk].command_id, bytes(rows[t.execution_pk].execution_ref),
        bytes(rows[t.execution_pk].projection.input), rows[t.execution_pk].account_id, t.execution_pk)
        for t in tokens])
    assert all(r is not None for r in receipts.values())
    stale = tokens[0]
    Execution.objects.filter(pk=stale.execution_pk).update(lease_fence=stale.lease_fence + 1)
    settled = execution.execution_record_results(items=[
        execution.ResultToRecord(t.execution_pk, rows[t.execution_pk].command_id,
                                 bytes(rows[t.execution_pk].execution_ref_digest), t.lease_fence) for t in tokens])
    assert set(settled) == {tokens[1].execution_pk}
    assert Execution.objects.get(pk=stale.execution_pk).state == "ready"
    assert OrderingLane.objects.get(pk=rows[stale.execution_pk].lane_id).active_execution_id == stale.execution_pk


def test_runtime_batch_is_idempotent_and_a_mismatched_digest_takes_the_failing_path(two_accounts):
    """Applying the same batch twice returns the stored results and applies nothing again (CRM versions stay 1);
    a command presented with another ExecutionRef is not answered by the batch (None): the per-command path
    fails it closed (RUNTIME_RESULT_MISMATCH). Proves: CV2-08-010, CV2-08-012, CV2-08-005"""
    acct = two_accounts.accounts[0]
    minted = _deliver(two_accounts, acct, [webhook_event(f"i-{i}", f"i{i}", 1) for i in range(3)])
    commands = [runtime.RuntimeCommand(e.command_id, bytes(e.execution_ref), bytes(e.projection.input),
                                       e.account_id, e.pk) for e in minted]
    first = runtime.runtime_commands_apply(commands=commands)
    again = runtime.runtime_commands_apply(commands=commands)
    assert first.keys() == again.keys()
    def fields(r):
        return r.command_id, r.execution_ref_digest, r.outcome, r.result_digest, r.receipt, r.committed_at
    assert {cid: fields(r) for cid, r in first.items()} == {cid: fields(r) for cid, r in again.items()}
    assert set(CrmRecord.objects.filter(account=acct).values_list("version", flat=True)) == {1}
    assert ApplicationResult.objects.count() == 3
    forged = runtime.RuntimeCommand(commands[0].command_id, commands[0].execution_ref + b"x", commands[0].input,
                                    acct.pk, minted[0].pk)
    assert runtime.runtime_commands_apply(commands=[forged]) == {forged.command_id: None}
    with pytest.raises(runtime.RuntimeResultMismatch):
        runtime.runtime_command_apply(command_id=forged.command_id, execution_ref=forged.execution_ref,
                                      input=forged.input, account_id=acct.pk)


def test_a_failing_batch_rolls_back_and_every_item_runs_alone(two_accounts, monkeypatch):
    """An error inside the Runtime batch transaction (after its writes) rolls the whole batch back and every
    Execution takes the per-item step: each completes with exactly one ApplicationResult and CRM version 1. The
    same for an error inside the completion batch (after Runtime committed): the per-item step completes each
    from the stored result. Proves: CV2-08-010, CV2-07-022, CV2-02-007"""
    acct = two_accounts.accounts[0]
    _deliver(two_accounts, acct, [webhook_event(f"f-{i}", f"f{i}", 1) for i in range(3)])
    real_apply = runtime._apply_planned

    def apply_then_fail(todo, out):
        real_apply(todo, out)
        raise RuntimeError("injected after the batch's writes")
    with monkeypatch.context() as m:
        m.setattr(runtime, "_apply_planned", apply_then_fail)
        m.setattr(execution, "_RECORD_RESULTS_SQL", "SELECT injected_failure()")
        done = execution.execution_claim_batch_and_run(holder="w", n=10)
    assert len(done) == 3 and {e.state for e in done} == {"completed"}
    assert ApplicationResult.objects.count() == 3
    assert set(CrmRecord.objects.filter(account=acct).values_list("version", flat=True)) == {1}

    _deliver(two_accounts, acct, [webhook_event(f"g-{i}", f"g{i}", 1) for i in range(3)])
    with monkeypatch.context() as m:
        m.setattr(execution, "_RECORD_RESULTS_SQL", "SELECT injected_failure()")
        calls = []
        real_run = execution.execution_run
        m.setattr(execution, "execution_run", lambda **kw: calls.append(kw) or real_run(**kw))
        done = execution.execution_claim_batch_and_run(holder="w", n=10)
    assert len(calls) == 3 and {e.state for e in done} == {"completed"}
    assert ApplicationResult.objects.count() == 6
    assert set(CrmRecord.objects.filter(account=acct).values_list("version", flat=True)) == {1}


def _pushing_world(monkeypatch):
    """The demo world with a pushing route (two accounts), every author hook call recorded, every dispatch
    wake-up counted."""
    from connector import hooks
    from connector.demo import build_world
    from effects.services import runtime_bridge

    world = build_world("rp-", push=True)
    calls, wakes = [], []
    real = hooks.author_outbound
    monkeypatch.setattr(hooks, "author_outbound", lambda many: calls.extend(many) or real(many))
    monkeypatch.setattr(runtime_bridge, "_wake_dispatch", lambda: wakes.append(1))
    return world, calls, wakes


def _normalized(call: dict, execution_pk_to_name: dict) -> tuple:
    """An author hook call without what differs per account and per command (their identities)."""
    return (call["record_key"][-2:], call["route_definition"], call["fields"]["email"][-12:],
            call["suppress_external_effects"], execution_pk_to_name[call["execution_id"]],
            call["ctx"].epoch_digest, call["ctx"].fence)


def test_a_pushing_route_runs_in_the_batch_with_the_per_item_authoring(transactional_db, monkeypatch):
    """A route that authors outbound runs through the batch path (D-293): the guard of its accounts is taken in
    the batch transaction and every applied change is authored (set-based, D-296) with the same arguments as the
    per-item path (`runtime_command_apply`) passes its author hook for the same events; each completed Execution has exactly one
    OutboundCommand (source execution, exact guarded epoch and fence) and one RemoteEffect, its ApplicationResult
    commits with them, and the batch sends one dispatch wake-up, not one per command.
    Proves: CV2-10-005, CV2-08-005, CV2-10-001, CV2-14-001"""
    from effects.models import OutboundCommand, RemoteEffect
    from tests.crash.support import ready_execution

    world, calls, wakes = _pushing_world(monkeypatch)
    batch_acct, item_acct = world.accounts
    for acct in (batch_acct, item_acct):
        for i in range(3):
            ready_execution(acct.account_key, f"p{i}")
    names = {e.pk: e.lane.partition[-2:] for e in Execution.objects.select_related("lane")}
    with monkeypatch.context() as m:
        _no_per_item(m)
        done = execution.execution_claim_batch_and_run(holder="w", n=10, account_ids=[batch_acct.pk])
    assert [e.state for e in done] == ["completed"] * 3 and len(wakes) == 1
    batch_calls = [_normalized(c, names) for c in calls]
    calls.clear()
    wakes.clear()
    done_items = _per_item(account_ids=[item_acct.pk])
    assert [e.state for e in done_items] == ["completed"] * 3 and len(wakes) == 3
    assert sorted(batch_calls, key=repr) == sorted((_normalized(c, names) for c in calls), key=repr)
    gate = AccountServingGate.objects.get(account=batch_acct)
    for e in done:
        command = OutboundCommand.objects.get(source_execution_id=e.pk)
        assert (command.account_id, command.epoch_id, command.gate_fence) == (batch_acct.pk, gate.epoch_id,
                                                                              gate.fence)
        assert bytes(command.epoch_digest) == bytes(gate.epoch_digest)
        assert command.effect_root_id == f"{e.command_id}:{e.lane.partition}"
        assert RemoteEffect.objects.filter(command=command).count() == 1
        assert ApplicationResult.objects.get(command_id=e.command_id).outcome == "applied"
    assert OutboundCommand.objects.filter(account=item_acct).count() == 3


def test_a_refused_outbound_item_rolls_the_batch_back_and_the_per_item_path_records_it(transactional_db,
                                                                                      monkeypatch):
    """An item whose outbound intent the author refuses (ApplicationItemRejected, here OUTBOUND_PATH_UNSAFE for
    one record) rolls the whole batch back; every command then runs alone: the refused one is recorded
    `rejected:OUTBOUND_PATH_UNSAFE` with no CRM change and no command (its savepoint, D-172), the others apply
    and author exactly one command each. Proves: CV2-10-005, CV2-08-005, CV2-02-007"""
    from effects.errors import OutboundPathUnsafe
    from effects.models import OutboundCommand
    from effects.services import outbound
    from tests.crash.support import ready_execution

    world, calls, _wakes = _pushing_world(monkeypatch)
    acct = world.accounts[0]
    ready = [ready_execution(acct.account_key, f"q{i}") for i in range(3)]
    real_path = outbound.outbound_path

    def unsafe_for_q1(template, params):
        if str(params.get("record_key", "")).endswith("q1"):
            raise OutboundPathUnsafe("test: unsafe path")
        return real_path(template, params)

    monkeypatch.setattr(outbound, "outbound_path", unsafe_for_q1)
    per_item = []
    real_run = execution.execution_run
    monkeypatch.setattr(execution, "execution_run", lambda **kw: per_item.append(kw) or real_run(**kw))
    done = execution.execution_claim_batch_and_run(holder="w", n=10, account_ids=[acct.pk])
    assert len(per_item) == 3 and {e.state for e in done} == {"completed"}
    results = {r.command_id: r for r in ApplicationResult.objects.filter(command_id__in=[e.command_id
                                                                                          for e in ready])}
    by_key = {e.lane.partition[-2:]: e for e in Execution.objects.filter(pk__in=[e.pk for e in ready])
              .select_related("lane")}
    assert results[by_key["q1"].command_id].detail == "rejected:OUTBOUND_PATH_UNSAFE"
    assert not CrmRecord.objects.filter(account=acct, record_key=by_key["q1"].lane.partition).exists()
    assert {k: OutboundCommand.objects.filter(source_execution_id=by_key[k].pk).count() for k in by_key} == \
        {"q0": 1, "q1": 0, "q2": 1}
    assert OutboundCommand.objects.filter(account=acct).count() == 2


def test_results_settle_while_the_gate_halts(two_accounts, monkeypatch):
    """A gate moved to `halting_v2` after the claim: the claimed work still settles (settling guard, CV2-11-006,
    D-130), through the batch path, on its exact epoch. Proves: CV2-11-006, CV2-03-015"""
    acct = two_accounts.accounts[0]
    _deliver(two_accounts, acct, [webhook_event(f"h-{i}", f"h{i}", 1) for i in range(2)])
    tokens = execution.execution_claim_batch(holder="w", n=10)
    gate = AccountServingGate.objects.get(account=acct)
    assert gates.gate_transition(account_id=acct.pk, action="halt_v2", actor=ACTOR, expected_fence=gate.fence,
                                 reason="test").mode == GateMode.HALTING_V2
    _no_per_item(monkeypatch)
    done = execution.execution_run_batch(tokens=tokens)
    assert {e.state for e in done} == {"completed"}


def test_two_batch_workers_on_shared_records_apply_each_command_once(two_accounts):
    """Two worker steps on their own connections, at the same moment, over two accounts' backlogs: every
    Execution completes once, one ApplicationResult per command, no error, no deadlock.
    Proves: CV2-07-016, CV2-08-010, CV2-15-024"""
    for account in two_accounts.accounts:
        _deliver(two_accounts, account, [webhook_event(f"c-{account.pk}-{i}", f"c{i}", 1) for i in range(12)])
    def worker(name):
        def run():
            got = []
            while batch := execution.execution_claim_batch_and_run(holder=name, n=5, lease_seconds=60):
                got += [e.pk for e in batch]
            return got
        return run

    results = run_concurrently([worker(f"w{i}") for i in range(2)])
    assert raised(results) == []
    assert sorted(results[0] + results[1]) == sorted(Execution.objects.values_list("pk", flat=True))
    assert set(Execution.objects.values_list("state", flat=True)) == {"completed"}
    assert ApplicationResult.objects.count() == 24
    assert set(CrmRecord.objects.values_list("version", flat=True)) == {1}
