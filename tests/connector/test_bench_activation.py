"""`manage.py bench activation`: the whole-service first activation measured at N accounts, a kill in the middle of
its transaction leaves nothing partial, and --check names every figure above its budget (CV2-14-005, CV2-14-006,
CV2-14-007, CV2-14-009)."""
from __future__ import annotations

import io
import json
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from bench.activation import (BUDGET_FIGURES, SUCCESSOR_STATUS, ActivationReport, ActivationResult, format_table,
                              measure_activation, readback)
from bench.activation_goals import check_budgets, load_budgets, suggest_budgets
from bench.activation_scenarios import SCENARIOS
from bench.activation_timing import Phases, timed_activation
from bench.wal import Wal
from bench.activation_world import ActivationBenchError, build_activation_world, checkpoint
from bench.activation_kill import LockCensus, Recovery, Untouched, kill_mid_activation
from connector.choices import EpochState, GateMode
from bench.stats import Stats
from connector.models import AccountServingGate, AuditRecord, ServingEpoch
from connector.selectors.owners import service_configuration_read

# The benchmarks create throwaway databases, CHECKPOINT and setval: the administrator, not the product's roles.
pytestmark = pytest.mark.usefixtures("administrator")

DB = {"transaction": True, "databases": ["default", "journal"]}
N = 50


def _gates(world):
    return list(AccountServingGate.objects.filter(account__configurations__generation_id=world.configuration_pk)
                .order_by("account_id"))


def _assert_nothing_activated(world) -> None:
    """The epoch is still `verified`, every gate still `v2_validating` with its old fence and no epoch, and no
    activation audit row exists."""
    assert ServingEpoch.objects.get(pk=world.epoch_pk).state == EpochState.VERIFIED
    gates = _gates(world)
    assert len(gates) == N
    assert {g.mode for g in gates} == {GateMode.V2_VALIDATING}
    assert all(g.epoch_id is None and g.fence == world.fences[g.account_id] for g in gates)
    assert not AuditRecord.objects.filter(action__in=("epoch_activate_first", "gate_activate_first")).exists()


@pytest.mark.django_db(**DB)
def test_kill_mid_activation_leaves_no_partial_activation():
    """An N-account world whose configuration was written in bulk is accepted by the configuration owner's reader
    and by epoch verification. A child process running epoch_activate_first is SIGKILLed while it holds the locks
    (after the gate locks; then just before COMMIT, every gate updated and audited): its locks are released, the
    epoch stays `verified` and every gate `v2_validating` with its fence, and a retried activation commits every
    gate to `v2_serving` naming the epoch with a new fence. Proves: CV2-14-007, CV2-14-009"""
    world = build_activation_world(N, prefix="k-")
    fact = service_configuration_read(generation_id=world.configuration_generation_id)
    assert len(fact.account_keys) == N and len(fact.relation) == 2 * N
    assert world.credential_generations == 2 * N
    _assert_nothing_activated(world)

    for kill_at in ("after_gate_locks", "before_commit"):
        checkpoint()
        recovery = kill_mid_activation(world, kill_at=kill_at)
        assert recovery.census.point == kill_at
        assert recovery.census.row_locks == {"connector_accountservinggate": N, "connector_servingepoch": 1}
        # row locks only: no per-gate heavyweight lock (advisory or other) in PostgreSQL's shared lock table
        assert not [k for k in recovery.census.lock_table if k.startswith("advisory")], recovery.census.lock_table
        assert recovery.census.total_lock_table < N
        assert recovery.locks_released_ms >= 0
        assert recovery.untouched == Untouched(epoch_state="verified", gates=N, gates_validating=N,
                                               gates_naming_epoch=0, fences_changed=0, activation_audit_rows=0,
                                               rows_still_locked=0)
        assert recovery.partial_visible is False
        _assert_nothing_activated(world)
    # the killed attempt before COMMIT had written every gate update and audit row: WAL that never became visible
    assert recovery.child_wal.bytes > 0

    phases, wal = timed_activation(world)
    assert 0 < phases.transaction_ms < phases.call_ms
    assert wal.bytes > 0 and "connector_accountservinggate" in wal.by_relation
    assert readback(world) > 0
    epoch = ServingEpoch.objects.get(pk=world.epoch_pk)
    assert epoch.state == EpochState.ACTIVE
    for gate in _gates(world):
        assert gate.mode == GateMode.V2_SERVING and gate.epoch_id == epoch.pk
        assert bytes(gate.epoch_digest) == bytes(epoch.digest) and gate.fence == world.fences[gate.account_id] + 1


@pytest.mark.django_db(**DB)
def test_measure_activation_produces_every_figure():
    """One cardinality measured end to end: setup, killed attempt, timed retry (reread and locked transaction
    split), readbacks, WAL bytes, locks held at commit time (N gates + the epoch), recovery time, rows. Every
    budgeted figure is produced. Proves: CV2-14-005, CV2-14-006"""
    result = measure_activation(N, prefix="m-", readback_repeat=3)
    figures = result.figures()
    assert set(figures) == set(BUDGET_FIGURES)
    assert all(value is not None and value >= 0 for value in figures.values()), figures
    assert figures["row_locks"] == N + 1
    assert figures["wal_bytes"] > 0 and result.wal.records > 0
    assert figures["recovery_ms"] > figures["locks_released_ms"]
    # the locks are released first, then the retry rereads the owners and runs the transaction
    assert figures["recovery_ms"] == pytest.approx(figures["locks_released_ms"] + result.phases.call_ms, abs=0.01)
    assert result.readback_ms.n == 3 and result.readback_ms.p50 <= result.readback_ms.p99
    p = result.phases
    parts = p.epoch_lock_ms + p.gate_lock_ms + p.epoch_update_ms + p.gate_update_ms + p.commit_ms
    assert p.transaction_ms == pytest.approx(parts, abs=0.05)
    assert p.call_ms >= p.reread_ms + p.transaction_ms - 0.05
    rows = dict(result.rows)
    assert rows.pop("epoch_preimage_bytes") > rows.pop("epoch_preimage_stored_bytes") > 0
    assert rows.pop("configuration_payload_bytes") > 0
    assert rows == {"gate_rows": N, "epoch_rows": 1, "audit_rows": N + 1, "ordering_handoff_rows": 0,
                    "lane_rows": 0, "credential_proof_rows": 2 * N}
    assert result.recovery.partial_visible is False
    assert result.per_account()["transaction_us"] > 0
    data = result.as_dict()
    assert data["figures"] == figures and data["recovery"]["census"]["total_row_locks"] == N + 1
    json.dumps(data)


@pytest.mark.django_db(**DB)
def test_check_fails_against_an_impossibly_strict_budget(tmp_path, monkeypatch):
    """`bench activation --check` against ceilings no run can meet exits non-zero and names every broken figure;
    the table (with the successor-activation status) and the --json report are written first. The measurement runs
    on this test's database: creating and migrating the two throwaway databases is `make bench`'s part (its
    hot-account and history runs use the same ThrowawayDatabases). Proves: CV2-14-006, CV2-14-009"""
    from bench import databases

    monkeypatch.setattr(databases, "ThrowawayDatabases", _NoDatabase)
    budgets = tmp_path / "budgets.json"
    budgets.write_text(json.dumps({"history": {"max_p50_admission_ratio": 1.2}, "activation": {
        "_note": "impossibly strict", str(N): {figure: 0 for figure in BUDGET_FIGURES}}}))
    report_path = tmp_path / "activation.json"
    out = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("bench", "activation", "--accounts", str(N), "--database-name", f"cb_act_t{os.getpid()}",
                     "--budgets", str(budgets), "--check", "--json", str(report_path), "--readback-repeat", "2",
                     stdout=out, stderr=io.StringIO())
    message = str(raised.value)
    for figure in BUDGET_FIGURES:
        assert f"50 accounts: {figure} " in message, message
    assert f"successor activation: {SUCCESSOR_STATUS}" in out.getvalue()
    report = json.loads(report_path.read_text())
    assert report["successor_activation"] == SUCCESSOR_STATUS
    (result,) = report["first_activation"]
    assert result["accounts"] == N and result["figures"]["row_locks"] == N + 1


def test_repository_budgets_cover_every_default_cardinality():
    """bench/budgets.json's "activation" section has a ceiling for every budgeted figure at each default
    cardinality (1,000, 10,000 and 100,000 accounts), with row locks exactly N + 1 (the gates and the epoch).
    Proves: CV2-14-006"""
    from django.conf import settings

    from bench.activation import DEFAULT_ACCOUNTS

    budgets = load_budgets(settings.BASE_DIR / "bench" / "budgets.json")
    for accounts in DEFAULT_ACCOUNTS.split(","):
        assert set(budgets[accounts]) == set(BUDGET_FIGURES), accounts
        assert budgets[accounts]["row_locks"] == int(accounts) + 1
        assert all(ceiling > 0 for ceiling in budgets[accounts].values()), accounts


def _result(accounts: int, **figures) -> ActivationResult:
    values = {"transaction_ms": 100.0, "commit_ms": 5.0, "readback_ms": 2.0, "wal_bytes": 1000,
              "locks_released_ms": 10.0, "recovery_ms": 400.0, "row_locks": accounts + 1, **figures}
    census = LockCensus(point="before_commit", row_locks={"connector_accountservinggate": values["row_locks"]},
                        lock_table={"relation RowExclusiveLock": 3})
    untouched = Untouched("verified", accounts, accounts, 0, 0, 0, 0)
    wal = Wal(values["wal_bytes"], 10, 0, values["wal_bytes"])
    recovery = Recovery("before_commit", census, untouched, values["locks_released_ms"], Wal(None, None, None, 0),
                        retried_commit_ms=values["recovery_ms"])
    phases = Phases(call_ms=300.0, reread_ms=200.0, epoch_lock_ms=1.0, gate_lock_ms=1.0, epoch_update_ms=1.0,
                    gate_update_ms=92.0, commit_ms=values["commit_ms"], transaction_ms=values["transaction_ms"])
    return ActivationResult(accounts=accounts, setup_seconds={"total": 1.0}, setup_rows=1, phases=phases, wal=wal,
                            readback_ms=Stats.of([values["readback_ms"]]), recovery=recovery, rows={})


def test_check_budgets_names_each_broken_figure_and_never_passes_vacuously(tmp_path):
    """Every figure above its ceiling is named with the cardinality; a measured cardinality without a budget, a
    budgeted figure that was not measured and an unknown figure are failures too. The budget file's other
    sections and the section's comments are ignored. Proves: CV2-14-006"""
    path = tmp_path / "budgets.json"
    path.write_text(json.dumps({"hot_account": {"clients": {}}, "activation": {
        "description": "text", "headroom": {"durations": 3}, "1000": {"commit_ms": 9}}}))
    assert load_budgets(path) == {"1000": {"commit_ms": 9}}
    path.write_text(json.dumps({"history": {}}))
    with pytest.raises(ActivationBenchError, match="no 'activation' section"):
        load_budgets(path)
    report = ActivationReport(command="", kill_at="before_commit", readback_repeat=1,
                              results=[_result(1000), _result(10000, wal_bytes=None)])
    budgets = suggest_budgets(ActivationReport(command="", kill_at="before_commit", readback_repeat=1,
                                               results=[_result(1000)]))
    assert budgets["1000"]["row_locks"] == 1001 and budgets["1000"]["transaction_ms"] == 300
    assert check_budgets(ActivationReport(command="", kill_at="x", readback_repeat=1, results=[_result(1000)]),
                         budgets) == []
    assert check_budgets(report, budgets) == ["10,000 accounts: no activation budget"]
    budgets["10000"] = {"wal_bytes": 10, "commit_ms": 1.0, "row_locks": 10001, "bogus": 1}
    budgets["1000"]["commit_ms"] = 4.5
    assert check_budgets(report, budgets) == [
        "1,000 accounts: commit_ms 5.0 > ceiling 4.5",
        "10,000 accounts: wal_bytes was not measured (ceiling 10)",
        "10,000 accounts: commit_ms 5.0 > ceiling 1.0",
        "10,000 accounts: unknown figure 'bogus' in the budget",
    ]


class _NoDatabase:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def test_a_cardinality_that_cannot_be_measured_is_reported_not_dropped(tmp_path, monkeypatch):
    """When one cardinality fails (the product refuses, or the bench cannot run it), the others are still
    reported, the failure is named in the table and the JSON report, and the command exits non-zero.
    Proves: CV2-14-009"""
    from bench import activation
    from bench import databases

    def measure(accounts, **kwargs):
        if accounts == 20:
            raise ActivationBenchError("epoch verification refused")
        return _result(accounts)

    monkeypatch.setattr(databases, "ThrowawayDatabases", _NoDatabase)
    monkeypatch.setattr(activation, "server_facts", lambda: ("15", {}))
    monkeypatch.setattr(activation, "measure_activation", measure)
    report_path = tmp_path / "report.json"
    out = io.StringIO()
    with pytest.raises(CommandError, match="not measured: 20 accounts: ActivationBenchError: epoch verification"):
        call_command("bench", "activation", "--accounts", "10,20", "--json", str(report_path), stdout=out,
                     stderr=io.StringIO())
    assert "20 accounts: NOT MEASURED: ActivationBenchError: epoch verification refused" in out.getvalue()
    report = json.loads(report_path.read_text())
    assert [r["accounts"] for r in report["first_activation"]] == [10]
    assert report["failures"] == [{"accounts": 20, "error": "ActivationBenchError: epoch verification refused"}]


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_successor_scenario_runs_end_to_end():
    """`--scenario successor` at 24 accounts: the first-activation world activated with 4 lanes per account, a
    successor verified over the same accounts, every gate halted through halt_all, the barrier set held, every lane
    handed off (bulk, digests by handoff_digests.digest_of_handoff: successor_activate byte-checks each one); a killed
    successor_activate leaves nothing partial (successor verified, gates v2_halted, no successor audit rows, no row
    locks), the retry commits, every gate names the successor with its fence advanced by one, and the raw shape
    locked the same lanes. Proves: CV2-14-005, CV2-14-006, CV2-14-007"""
    from cutover.models import ServingPublicationBarrierSet

    result = SCENARIOS["successor"](24, prefix="bs-", readback_repeat=2)
    assert result.scenario == "successor"
    assert not result.recovery.partial_visible
    assert result.recovery.untouched.epoch_state == "verified"
    assert result.recovery.untouched.gates_validating == 24  # still v2_halted after the kill
    assert result.recovery.untouched.activation_audit_rows == 0
    figures = result.figures()
    assert all(value is not None for value in figures.values()), figures
    lanes = 2 * 4 * 24  # predecessor and successor lanes, 4 partitions per account
    assert figures["row_locks"] == 24 + 3 + lanes  # gates, both epochs, the barrier set, every lane
    assert result.recovery.census.row_locks["connector_orderinglane"] == lanes
    assert result.rows["ordering_handoff_rows"] == 4 * 24 and result.rows["lane_rows"] == lanes
    assert result.raw.rows == 24 and result.raw.lanes_locked == lanes
    assert result.rows["audit_rows"] == 2 + 24  # barrier set, successor, gates
    # (the predecessor's row carries the predecessor's digest)
    epochs = dict(ServingEpoch.objects.filter(epoch_id__in=["bs-activation-epoch", "bs-activation-epoch-2"])
                  .values_list("epoch_id", "state"))
    assert epochs == {"bs-activation-epoch": EpochState.DRAINING, "bs-activation-epoch-2": EpochState.ACTIVE}
    assert set(ServingPublicationBarrierSet.objects.values_list("state", flat=True)) == {"activation_committed"}
    successor = ServingEpoch.objects.get(epoch_id="bs-activation-epoch-2")
    assert set(AccountServingGate.objects.filter(account__account_key__startswith="bs-")
               .values_list("mode", "epoch_id").distinct()) == {(GateMode.V2_SERVING, successor.pk)}
    report = ActivationReport(command="", kill_at="before_commit", readback_repeat=2, results=[result])
    assert suggest_budgets(report)["successor"]["24"]["row_locks"] == 24 + 3 + lanes
    from cutover.models import OrderingHandoff
    from connector.models import OrderingLane
    assert OrderingHandoff.objects.count() == 4 * 24
    assert set(OrderingLane.objects.filter(epoch=successor).values_list("state", flat=True)) == {"open"}
    assert check_budgets(report, {"24": {}}) == ["24 accounts: no successor activation budget"]
    assert "successor activation (succession.successor_activate" in format_table(report)
    assert report.as_dict()["scenarios"]["successor"][0]["scenario"] == "successor"


@pytest.mark.django_db(**DB)
def test_raw_reference_moves_the_same_rows_with_the_triggers_and_leaves_nothing():
    """The raw set-based reference of `bench activation` (issue 19) moves every gate of the account set and
    writes one audit row each in ONE statement, with the row triggers firing (an edge outside the seed's table is
    refused by the transition trigger), and rolls back: the world is unchanged and the product's activation
    still commits after it. Proves: CV2-14-006"""
    from django.db import IntegrityError, connection, transaction

    from bench import activation as bench_activation
    from connector.actors import Actor
    from connector.services import serving

    world = build_activation_world(N, prefix="raw-")
    before = [(g.pk, g.mode, g.fence, g.epoch_id) for g in _gates(world)]
    audits = AuditRecord.objects.count()
    raw = bench_activation.raw_reference(world)
    assert raw.rows == N and raw.statement_ms > 0 and raw.rolled_back_ms >= raw.statement_ms
    assert [(g.pk, g.mode, g.fence, g.epoch_id) for g in _gates(world)] == before
    assert AuditRecord.objects.count() == audits
    with pytest.raises(IntegrityError) as refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(bench_activation.RAW_REFERENCE_SQL, {  # v2_validating -> v2_halted is not a seed edge
            "source": "v2_validating", "target": "v2_halted", "epoch_pk": world.epoch_pk,
            "epoch_digest": world.epoch_digest, "account_ids": sorted(world.fences), "actor": "t", "action": "x"})
    assert refused.value.__cause__.diag.constraint_name == "connector_accountservinggate_transition"
    epoch = serving.epoch_activate_first(epoch_pk=world.epoch_pk, actor=Actor.system("t"))
    assert epoch.state == EpochState.ACTIVE


@pytest.mark.django_db(**DB)
def test_cutover_scenario_measures_the_coordinator_and_leaves_nothing_partial():
    """`--scenario cutover` at 24 accounts: the attempt, its certificates and rehearsed restore point, the decision
    rollback_open, the barrier set acquired and held and the activation decision dual-approved; a
    first_activation_commit paused at the product's crash point activation.before_commit holds the gates, the epoch
    and the barrier set (N + 2 row locks) and, SIGKILLed, leaves nothing visible (epoch verified, gates
    v2_validating, set still held); the timed resume commits through the journal decision, reads back, releases
    the set and closes the attempt v2_committed; the raw shape moved the same gates. Proves: CV2-14-005,
    CV2-14-006, CV2-14-007, CV2-14-009"""
    from cutover.choices import BarrierSetState, DecisionState
    from cutover.models import AttemptOutcome, ServiceCutoverAttempt, ServingPublicationBarrierSet
    from cutover.services import decision as decisions

    result = SCENARIOS["cutover"](24, prefix="cu-", readback_repeat=2)
    assert result.scenario == "cutover" and not result.recovery.partial_visible
    assert result.recovery.census.point == "before_commit"
    assert result.recovery.census.row_locks == {"connector_accountservinggate": 24, "connector_servingepoch": 1,
                                                "cutover_servingpublicationbarrierset": 1}
    assert result.recovery.untouched.gates_validating == 24 and result.recovery.untouched.activation_audit_rows == 0
    assert result.raw.rows == 24 and result.raw.lanes_locked == 0
    p = result.phases
    assert 0 < p.transaction_ms < p.call_ms and p.gate_lock_ms > 0 and p.gate_update_ms > 0
    assert p.transaction_ms == pytest.approx(p.epoch_lock_ms + p.gate_lock_ms + p.epoch_update_ms
                                             + p.gate_update_ms + p.commit_ms, abs=0.05)
    assert result.figures()["row_locks"] == 24 + 2
    assert result.rows["barrier_set_rows"] == 1 and result.rows["audit_rows"] == 24 + 1
    attempt = ServiceCutoverAttempt.objects.get(attempt_key="cu-bench-cutover")
    assert attempt.outcome == AttemptOutcome.V2_COMMITTED
    assert decisions.decision_read("cu-bench-cutover").state == DecisionState.V2_COMMITTED
    assert ServingPublicationBarrierSet.objects.get(attempt_key="cu-bench-cutover").state == BarrierSetState.RELEASED
    assert set(AccountServingGate.objects.filter(account__account_key__startswith="cu-")
               .values_list("mode", flat=True)) == {GateMode.V2_SERVING}
    report = ActivationReport(command="", kill_at="before_commit", readback_repeat=2, results=[result])
    assert suggest_budgets(report)["cutover"]["24"]["row_locks"] == 26
    assert "first activation through the coordinator" in format_table(report)


def _stored(scenario: str, accounts: int, *, txn: float, raw: float, recovery: float, reread: float = 10.0,
            readback: float = 5.0, wal: float = 900.0) -> dict:
    return {"accounts": accounts, "scenario": scenario, "load_average": 1.0,
            "phases": {"transaction_ms": txn, "reread_ms": reread}, "raw": {"statement_ms": raw},
            "figures": {"recovery_ms": recovery, "readback_ms": readback},
            "per_account": {"transaction_us": txn * 1000 / accounts, "wal_bytes": wal}}


GOALS = {"cutover": {"transaction_over_raw": 2.0, "recovery_over_transaction": 2.0,
                     "transaction_ms": {"100000": 10000}, "per_account_flatness": 1.3}}


def test_goal_check_fails_a_report_over_a_goal_and_never_passes_a_missing_n():
    """The goals block judged on a JSON report: a ratio above its goal is broken, a ceiling at an N the run did not
    measure is "not checked" (never passed), flatness needs two cardinalities (largest N over smallest), WAL per
    account is reported, an unknown goal is broken, and a report on which no goal could be checked fails.
    Proves: CV2-14-006, CV2-14-009"""
    from bench.activation_goals import check_goals, goal_failures

    report = {"scenarios": {"cutover": [_stored("cutover", 1000, txn=30.0, raw=20.0, recovery=50.0),
                                        _stored("cutover", 10000, txn=500.0, raw=200.0, recovery=900.0)]},
              "failures": []}
    judged = {(j["goal"], j["accounts"]): j["status"] for j in check_goals(report, GOALS)}
    assert judged == {("transaction_over_raw", 1000): "passed", ("transaction_over_raw", 10000): "broken",
                      ("recovery_over_transaction", 1000): "passed", ("recovery_over_transaction", 10000): "passed",
                      ("transaction_ms", 100000): "not checked", ("wal_bytes_per_account", 1000): "reported",
                      ("wal_bytes_per_account", 10000): "reported", ("per_account_flatness", "10,000/1,000"): "broken"}
    assert goal_failures(check_goals(report, GOALS)) == [
        "cutover transaction_over_raw at 10,000: 2.5 (goal <= 2.0) -> broken",
        "cutover per_account_flatness at 10,000/1,000: 1.67 (goal <= 1.3) -> broken"]
    one = {"scenarios": {"cutover": [_stored("cutover", 100000, txn=9000.0, raw=5000.0, recovery=17000.0)]}}
    judged = {j["goal"]: j["status"] for j in check_goals(one, GOALS)}
    assert judged["transaction_ms"] == "passed" and judged["per_account_flatness"] == "not checked"
    assert goal_failures(check_goals(one, GOALS)) == []
    # nothing measured for the goals' scenarios: not checked is never a pass
    assert goal_failures(check_goals({"scenarios": {"first": [_stored("first", 1000, txn=1, raw=1, recovery=1)]}},
                                     GOALS)) == ["no activation goal could be checked on this report"]
    failed = {"scenarios": {}, "failures": [{"accounts": 1000, "scenario": "cutover", "error": "x"}]}
    assert {j["status"] for j in check_goals(failed, GOALS)} == {"not checked"}
    assert goal_failures(check_goals(one, {"cutover": {"bogus": 1}})) == [
        "cutover bogus: not measured (goal <= 1): unknown goal in the budgets -> broken"]


def test_repository_goals_are_the_issues_goals():
    """bench/budgets.json's activation.goals holds issue 19's limits for the real coordinators. Proves: CV2-14-006"""
    from django.conf import settings

    from bench.activation_goals import load_goals

    goals = load_goals(settings.BASE_DIR / "bench" / "budgets.json")
    for scenario, ceiling in (("cutover", 10000), ("first", 10000), ("successor", 15000)):
        g = goals[scenario]
        assert g["transaction_over_raw"] == 2.0, scenario
        # goal 4 for the coordinators; the bare path's recovery includes its mandatory owner reread (D-285)
        assert g.get("recovery_over_transaction") == (None if scenario == "first" else 2.0), scenario
        assert g["transaction_ms"] == {"100000": ceiling} and g["reread_ms"] == {"100000": 15000}
        assert g["readback_p99_ms"] == {"100000": 1000} and g["per_account_flatness"] == 1.3


def test_chart_and_check_from_a_stored_report(tmp_path):
    """`--from-json R.json --chart F.svg` redraws the chart from the report alone (one panel per scenario), and
    `--from-json --check` judges the stored report against the ceilings and the goals, naming what broke.
    Proves: CV2-14-006"""
    report = {"commit": "abc", "machine": "m", "failures": [],
              "scenarios": {"cutover": [_stored("cutover", 1000, txn=30.0, raw=10.0, recovery=50.0),
                                        _stored("cutover", 10000, txn=300.0, raw=150.0, recovery=500.0)],
                            "successor": [_stored("successor", 1000, txn=60.0, raw=40.0, recovery=100.0)]}}
    for r in report["scenarios"]["cutover"] + report["scenarios"]["successor"]:
        r["figures"].update({"transaction_ms": r["phases"]["transaction_ms"], "row_locks": r["accounts"] + 2})
    stored = tmp_path / "report.json"
    stored.write_text(json.dumps(report))
    chart = tmp_path / "chart.svg"
    out = io.StringIO()
    call_command("bench", "activation", "--from-json", str(stored), "--chart", str(chart), stdout=out)
    assert chart.read_text().lstrip().startswith("<?xml") and "successor_activate" in chart.read_text()
    budgets = tmp_path / "budgets.json"
    budgets.write_text(json.dumps({"activation": {"cutover": {"1000": {"transaction_ms": 25}}, "goals": GOALS}}))
    with pytest.raises(CommandError) as raised:
        call_command("bench", "activation", "--from-json", str(stored), "--check", "--budgets", str(budgets),
                     stdout=out)
    message = str(raised.value)
    assert "ceiling: 1,000 accounts: cutover transaction_ms 30.0 > ceiling 25" in message
    assert "ceiling: 10,000 accounts: no cutover activation budget" in message
    assert "goal: cutover transaction_over_raw at 1,000: 3 (goal <= 2.0) -> broken" in message
    assert "cutover transaction_ms at 100,000: not measured" in out.getvalue()


def _handoff_facts(world, prefix: str) -> list[tuple]:
    """Every handoff of the world's successor with its frozen and staged lanes and its audit row, keyed by account
    key without the world's prefix (so two worlds compare)."""
    from connector.models import OrderingLane
    from cutover.models import OrderingHandoff
    from cutover.services.handoff_digests import digest_of_handoff

    facts = []
    for h in OrderingHandoff.objects.filter(successor_epoch_id=world.epoch_pk).select_related("account"):
        old, new = OrderingLane.objects.get(pk=h.predecessor_lane_id), OrderingLane.objects.get(pk=h.successor_lane_id)
        audit = AuditRecord.objects.get(entity_type="cutover.OrderingHandoff", entity_id=str(h.pk))
        assert bytes(h.handoff_digest) == digest_of_handoff(h) == bytes(audit.evidence_digest)
        assert audit.reason == f"lane {old.pk} frozen at high-water {old.high_water}"
        facts.append((h.account.account_key.removeprefix(prefix), h.route, h.partition, h.predecessor_lane_fence,
                      h.high_water, h.high_water_tie, h.contract, bytes(h.contract_digest),
                      h.predecessor_route_version, h.successor_route_version, h.derived_from_id,
                      (old.state, old.halt_reason, old.fence, old.high_water),
                      (new.state, new.fence, new.baseline, new.baseline_origin, new.high_water, new.high_water_tie,
                       new.route_version, new.active_execution_id),
                      (audit.actor, audit.action, audit.from_state, audit.to_state, audit.fence)))
    return sorted(facts, key=repr)


@pytest.mark.django_db(**DB)
def test_bulk_handoffs_write_exactly_what_handoff_all_writes():
    """The successor world's bulk handoffs (D-275) and `succession_phases.handoff_all` (one ordering_handoff per
    lane), each on its own 6-account world with 2 lanes per account: the same handoffs (digest recomputed by
    handoff_digests.digest_of_handoff), the same frozen predecessor and staged successor lanes, the same audit rows; and
    successor_activate, which byte-checks every handoff against its lanes, accepts the bulk ones.
    Proves: CV2-14-005, CV2-14-006"""
    from bench.activation_coord import build_successor_world
    from connector.actors import Actor
    from cutover.models import ServingPublicationBarrierSet
    from cutover.services import succession_phases

    bulk = build_successor_world(6, prefix="hb-", partitions=2)
    # activated and released, so that the next world's owners may publish (the held set is a publication barrier)
    epoch, _ = succession_phases.activate_and_release(
        barrier_set=ServingPublicationBarrierSet.objects.get(pk=bulk.barrier_set_pk), expected_fence=None,
        actor=Actor.system("t"))
    assert epoch.state == EpochState.ACTIVE
    service = build_successor_world(6, prefix="hs-", partitions=2, handoffs="service")
    assert bulk.handoffs == service.handoffs == 12 and len(bulk.lane_pks) == len(service.lane_pks) == 24
    facts = _handoff_facts(bulk, "hb-")
    assert len(facts) == 12 and {f[4] is None for f in facts} == {True, False}  # some lanes never completed
    assert facts == _handoff_facts(service, "hs-")
