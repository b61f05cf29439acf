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

from bench.activation import (
    BUDGET_FIGURES,
    SCENARIOS,
    SUCCESSOR_STATUS,
    ActivationBenchError,
    ActivationReport,
    ActivationResult,
    LockCensus,
    Phases,
    Recovery,
    Untouched,
    Wal,
    build_activation_world,
    check_budgets,
    checkpoint,
    format_table,
    kill_mid_activation,
    load_budgets,
    measure_activation,
    readback,
    suggest_budgets,
    timed_activation,
)
from connector.choices import EpochState, GateMode
from bench.management.commands.bench import Stats
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
                    "credential_proof_rows": 2 * N}
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
    from bench.management.commands import bench

    monkeypatch.setattr(bench, "ThrowawayDatabases", _NoDatabase)
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
    from bench.management.commands import bench

    def measure(accounts, **kwargs):
        if accounts == 20:
            raise ActivationBenchError("epoch verification refused")
        return _result(accounts)

    monkeypatch.setattr(bench, "ThrowawayDatabases", _NoDatabase)
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
    """`--scenario successor` at 24 accounts: the first-activation world activated, a successor verified over the
    same accounts, every gate halted through gate_transition, the barrier set held (no lanes: zero handoffs); a
    killed successor_activate leaves nothing partial (successor verified, gates v2_halted, no successor audit rows,
    no row locks), the retry commits, and every gate names the successor with its fence advanced by one."""
    from cutover.models import ServingPublicationBarrierSet

    result = SCENARIOS["successor"](24, prefix="bs-", readback_repeat=2)
    assert result.scenario == "successor"
    assert not result.recovery.partial_visible
    assert result.recovery.untouched.epoch_state == "verified"
    assert result.recovery.untouched.gates_validating == 24  # still v2_halted after the kill
    assert result.recovery.untouched.activation_audit_rows == 0
    figures = result.figures()
    assert all(value is not None for value in figures.values()), figures
    assert figures["row_locks"] == 24 + 3  # gates, both epochs, the barrier set
    assert result.rows["ordering_handoff_rows"] == 0 and result.rows["audit_rows"] == 2 + 24  # barrier set, successor, gates
    # (the predecessor's row carries the predecessor's digest)
    epochs = dict(ServingEpoch.objects.filter(epoch_id__in=["bs-activation-epoch", "bs-activation-epoch-2"])
                  .values_list("epoch_id", "state"))
    assert epochs == {"bs-activation-epoch": EpochState.DRAINING, "bs-activation-epoch-2": EpochState.ACTIVE}
    assert set(ServingPublicationBarrierSet.objects.values_list("state", flat=True)) == {"activation_committed"}
    successor = ServingEpoch.objects.get(epoch_id="bs-activation-epoch-2")
    assert set(AccountServingGate.objects.filter(account__account_key__startswith="bs-")
               .values_list("mode", "epoch_id").distinct()) == {(GateMode.V2_SERVING, successor.pk)}
    report = ActivationReport(command="", kill_at="before_commit", readback_repeat=2, results=[result])
    assert suggest_budgets(report)["successor"]["24"]["row_locks"] == 27
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
