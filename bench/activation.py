"""`manage.py bench activation`: the whole-service first activation transaction at scale (CV2-14-005, CV2-14-006,
CV2-14-007, CV2-14-009), measured on PostgreSQL.

For each account cardinality N the command builds, in a throwaway database, N accounts whose AccountServingGates
are `v2_validating`, the demo packs and Catalog view, two credential generations per account, one L2 configuration
generation over the N accounts with its exhaustive credential relation, and a prepared and verified ServingEpoch
over it (`build_activation_world`). It then runs the product's own `serving.epoch_activate_first` three times over:

1. **killed** (`kill_mid_activation`): a child process runs it and stops while it holds every lock, either just
   before COMMIT (after the last audit row: `before_commit`, the default) or just after the gate locks
   (`after_gate_locks`). A second session counts the locks it holds (pg_locks, and the row locks through
   pgrowlocks: PostgreSQL keeps row locks in the tuples, not in pg_locks). The child is SIGKILLed; the bench times
   until PostgreSQL has released the locks and asserts that nothing partial is visible: the epoch is still
   `verified`, every gate still `v2_validating` with its old fence, no activation audit row exists.
2. **retried and timed** (`timed_activation`), in this process: the owner reread before the transaction, the gate
   locks, the epoch and gate updates with their audit rows, the COMMIT. The WAL the transaction wrote is summed
   from its own records (pg_walinspect, filtered by its transaction id), so other sessions' WAL does not count
   (`bench.wal`: the range is closed at a flushed marker, so it holds with synchronous_commit off).
   Recovery time is from the SIGKILL to this retry's COMMIT, for a retry started as soon as the locks are gone:
   the lock release time plus the retry's whole call (the bench's own checks in between do not count).
3. **read back** (`readback`): every gate of the configuration names the epoch (id and digest) with its fence
   advanced by exactly one; repeated for p50/p95/p99.

Timing only wraps product functions to take timestamps (bench/activation_timing.py); the child's pause is such a
wrapper too. No product code is replaced.

`--scenario cutover` and `--scenario successor` (`both`: the two; `all`: the three; default `first`) measure the
real coordinators the same three ways (bench/activation_coord.py, D-275): `first_activation_commit` through the
barrier set and the CutoverDecision, and `successor_activate` with K lanes per account handed off. Row locks: N + 1
(first), N + 2 (cutover: the barrier set), N + 3 + 2KN (successor: both epochs, the set and every lane). Each
scenario's raw set-based shape runs in the same database; `--check` judges the ceilings and the goals
(bench/activation_goals.py, D-276), `--chart` draws cost against N (bench/activation_chart.py).

The activation locks rows only (N gates and the epoch, counted through pgrowlocks); its pg_locks entries are the
relation locks and transaction ids, the same at every N. The lock census reports both, and the server's nominal
shared lock table (`lock_table_capacity`) is reported with the server settings. The product findings the bench
first met at 100,000 accounts (a quadratic credential-relation check, one advisory lock per gate, the preimage
loaded and rewritten by every epoch transition) are fixed since 9fd3656; the epoch trigger's jsonb limit (an epoch
UPDATE fails above a 134,217,726-byte preimage, about 109,000 accounts) is still open (docs/benchmarks.md,
"Whole-service activation at scale", Findings).

Bulk rows (`build_activation_world`): the first two accounts, the packs, the Catalog view and their credential
generations are authored through the services (connector.demo.build_owners, walk_gates_to_validating). They are the
template of every other row. The other N-2 accounts, their gates (inserted in `v2_validating` with the template's
fence: the gate triggers fire before UPDATE only, and nothing is updated), the gates' audit trail (the template's
rows, one set per gate), the credential generations (receipts computed by connector.receipts exactly as
`credential_generation_create` does, secrets written as files of the secret backend), their dispatch gates, and
the configuration generation over all N accounts (payload, digest and receipt by connector.receipts exactly as
`service_configuration_create` does) are written in bulk. `service_configuration_read` then rereads and
byte-compares the configuration, and the epoch is prepared and verified through the services, which reread every
owner.
"""
from __future__ import annotations

import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench.activation_kill import ACTIVATION_ACTIONS, Recovery, kill_mid_activation
from bench.activation_timing import Phases, timed_activation
from bench.activation_world import (ACTOR, ActivationBenchError, ActivationWorld, PartialActivationVisible, Progress,
                                    _fresh_session, _ms, _scalar, build_activation_world, checkpoint, gate_fences,
                                    lock_table_capacity)
from bench.wal import Wal


SUCCESSOR_STATUS = "--scenario successor (or both, all): cutover.services.succession.successor_activate"

# both: the two real coordinators of issue 19 (cutover, successor); all: every scenario
SCENARIO_CHOICES = ("first", "cutover", "successor", "both", "all")

SCENARIO_SETS = {"both": ("cutover", "successor"), "all": ("first", "cutover", "successor")}

DEFAULT_ACCOUNTS = "1000,10000,100000"

DEFAULT_DATABASE = "connector_bench_act"

BUDGET_FIGURES = ("transaction_ms", "commit_ms", "readback_ms", "wal_bytes", "locks_released_ms", "recovery_ms",
                  "row_locks")

# -- 2. the timed activation: bench/activation_timing.py (timed_activation, Phases) -------------------------------
# -- 2b. the raw set-based reference ---------------------------------------------------------------------------
# The raw set-based shape of the same rows (issue 19): ONE UPDATE ... RETURNING of every gate of the account set
# feeding ONE INSERT ... SELECT of their audit rows, with every row trigger firing (transition, fence, append-only
# audit). No lock is taken first, no epoch row moves, nothing is read back into Python: the floor a set-based
# product can approach on this database. The edge is the django-fsm declaration's (gates.fsm_edge).
RAW_REFERENCE_SQL = """
WITH moved AS (
  UPDATE connector_accountservinggate AS g
     SET mode = %(target)s, epoch_id = %(epoch_pk)s, epoch_digest = %(epoch_digest)s::bytea, fence = g.fence + 1,
         changed_at = statement_timestamp()
   WHERE g.account_id = ANY(%(account_ids)s::bigint[]) AND g.mode = %(source)s
  RETURNING g.id, g.fence
)
INSERT INTO connector_auditrecord (at, actor, actor_user_id, entity_type, entity_id, action, from_state, to_state,
                                   fence, evidence_digest, reason)
SELECT statement_timestamp(), %(actor)s, NULL, 'connector.AccountServingGate', moved.id::text, %(action)s,
       %(source)s, %(target)s, moved.fence, %(epoch_digest)s::bytea, ''
  FROM moved
"""

# The successor's raw shape adds, first and in the same transaction, ONE SELECT ... FOR UPDATE of every
# predecessor and successor lane the activation locks (successor_activate's lanes_for_update, ascending id).
RAW_LANES_SQL = "SELECT count(*) FROM (SELECT id FROM connector_orderinglane WHERE id = ANY(%s::bigint[]) " \
                "ORDER BY id FOR UPDATE) locked"


@dataclass
class RawReference:
    statement_ms: float  # the one UPDATE ... RETURNING -> INSERT ... SELECT statement (successor: + the lane lock)
    rows: int  # audit rows it wrote (= gates it moved)
    rolled_back_ms: float  # BEGIN -> ROLLBACK acknowledged (it never commits: the product's run needs the rows)
    lanes_locked: int = 0  # successor: lanes locked FOR UPDATE by RAW_LANES_SQL


def raw_reference(world: ActivationWorld) -> RawReference:
    """Run RAW_REFERENCE_SQL over the world's account set in its pre-activation state (after the killed attempt,
    before the timed retry), in its own transaction, then ROLLBACK: the same rows, the same database, the same
    run. Refuses (ActivationBenchError) unless it moved every gate."""
    from connector.models import AccountServingGate
    from connector.services.gates import fsm_edge

    action = "activate_successor" if world.scenario == "successor" else "activate_first"
    source, target = fsm_edge(getattr(AccountServingGate, action))
    params = {"source": source, "target": target, "epoch_pk": world.epoch_pk, "epoch_digest": world.epoch_digest,
              "account_ids": sorted(world.fences), "actor": f"system:{ACTOR}", "action": f"gate_{action}"}
    _fresh_session()
    began, lanes = time.perf_counter(), 0
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            statement = time.perf_counter()
            if world.lane_pks:
                cursor.execute(RAW_LANES_SQL, [sorted(world.lane_pks)])
                lanes = cursor.fetchone()[0]
            cursor.execute(RAW_REFERENCE_SQL, params)
            done, rows = time.perf_counter(), cursor.rowcount
            raise _RolledBack()
    except _RolledBack:
        pass
    rolled_back = time.perf_counter()
    if rows != world.accounts:
        raise ActivationBenchError(f"raw reference moved {rows} of {world.accounts} gates")
    if lanes != len(world.lane_pks):
        raise ActivationBenchError(f"raw reference locked {lanes} of {len(world.lane_pks)} lanes")
    return RawReference(statement_ms=_ms(done - statement), rows=rows, rolled_back_ms=_ms(rolled_back - began),
                        lanes_locked=lanes)


class _RolledBack(Exception):
    """Leaves the raw reference's transaction.atomic() by rollback."""


# -- 3. readback ----------------------------------------------------------------------------------------------

def readback(world: ActivationWorld) -> float:
    """Read back every gate of the configuration's account set and require each to be `v2_serving`, naming the
    epoch (id and digest) with its fence advanced by exactly one. Returns milliseconds."""
    began = time.perf_counter()
    gates = gate_fences(world.configuration_pk)
    wrong = [account for account, (mode, fence, epoch_pk, digest) in gates.items()
             if mode != "v2_serving" or epoch_pk != world.epoch_pk or digest != world.epoch_digest
             or fence != world.fences[account] + 1]
    elapsed = time.perf_counter() - began
    if len(gates) != world.accounts or wrong:
        raise ActivationBenchError(f"readback: {len(gates)} gates, {len(wrong)} not naming the epoch with the new "
                                   f"fence: {wrong[:10]}")
    return _ms(elapsed)


# -- one cardinality ------------------------------------------------------------------------------------------

@dataclass
class ActivationResult:
    accounts: int
    setup_seconds: dict[str, float]
    setup_rows: int
    phases: Phases
    wal: Wal
    readback_ms: Any  # bench.Stats
    recovery: Recovery
    rows: dict[str, int]
    load_average: float = 0.0
    scenario: str = "first"
    raw: RawReference | None = None

    @property
    def raw_ratio(self) -> float | None:
        """The product's activation transaction over the raw set-based statement of the same rows (goal <= 2)."""
        if self.raw is None or not self.raw.statement_ms:
            return None
        return round(self.phases.transaction_ms / self.raw.statement_ms, 2)

    def figures(self) -> dict[str, float | int | None]:
        """The budgeted figures (BUDGET_FIGURES). wal_bytes is the larger of the committed retry and the killed,
        cold attempt (which wrote the full-page images)."""
        wal = [w for w in (self.wal.bytes, self.recovery.child_wal.bytes) if w is not None]
        return {"transaction_ms": self.phases.transaction_ms, "commit_ms": self.phases.commit_ms,
                "readback_ms": self.readback_ms.p99, "wal_bytes": max(wal) if wal else None,
                "locks_released_ms": self.recovery.locks_released_ms, "recovery_ms": self.recovery.retried_commit_ms,
                "row_locks": self.recovery.census.total_row_locks}

    def per_account(self) -> dict[str, float | None]:
        n = self.accounts
        f = self.figures()
        return {"transaction_us": round(self.phases.transaction_ms * 1000 / n, 2),
                "reread_us": round(self.phases.reread_ms * 1000 / n, 2),
                "readback_us": round(self.readback_ms.p50 * 1000 / n, 2),
                "wal_bytes": None if f["wal_bytes"] is None else round(f["wal_bytes"] / n, 1),
                "recovery_us": round((self.recovery.retried_commit_ms or 0) * 1000 / n, 2)}

    def as_dict(self) -> dict:
        data = asdict(self)
        data["figures"] = self.figures()
        data["per_account"] = self.per_account()
        data["raw_ratio"] = self.raw_ratio
        data["recovery"]["census"]["total_row_locks"] = self.recovery.census.total_row_locks
        data["recovery"]["census"]["total_lock_table"] = self.recovery.census.total_lock_table
        return data


def activation_rows(world: ActivationWorld) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FILTER (WHERE action = 'gate_activate_first'), "
                       "count(*) FILTER (WHERE action = 'epoch_activate_first') FROM connector_auditrecord "
                       "WHERE evidence_digest = %s AND action IN ('gate_activate_first', 'epoch_activate_first')",
                       [world.epoch_digest])
        gate_audits, epoch_audits = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM connector_servingepochcredentialproof WHERE epoch_id = %s",
                       [world.epoch_pk])
        proofs = cursor.fetchone()[0]
        cursor.execute("SELECT length(e.preimage), pg_column_size(e.preimage), length(c.payload) "
                       "FROM connector_servingepoch e JOIN connector_serviceconfigurationgeneration c "
                       "ON c.id = e.configuration_id WHERE e.id = %s", [world.epoch_pk])
        preimage, preimage_stored, payload = cursor.fetchone()
    if world.scenario == "successor":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM connector_auditrecord WHERE evidence_digest = %s AND action = ANY(%s)",
                           [world.epoch_digest, list(ACTIVATION_ACTIONS["successor"])])
            gate_audits, epoch_audits = cursor.fetchone()[0], 0
    extra = {"barrier_set_rows": 1} if world.barrier_set_pk is not None else {}
    return {"gate_rows": len(world.fences), "epoch_rows": 2 if world.scenario == "successor" else 1, **extra,
            "audit_rows": gate_audits + epoch_audits,
            # a first activation hands off no lanes; the successor world has K per account (--partitions), each
            # handed off, and the activation locks both sides of each handoff
            "ordering_handoff_rows": world.handoffs, "lane_rows": len(world.lane_pks),
            "credential_proof_rows": proofs,
            # the epoch's preimage (its jsonb trigger limit: finding 3), and the configuration every reread
            # re-encodes
            "epoch_preimage_bytes": preimage, "epoch_preimage_stored_bytes": preimage_stored,
            "configuration_payload_bytes": payload}


def measure_activation(accounts: int, *, prefix: str = "", kill_at: str = "before_commit", readback_repeat: int = 10,
                       progress: Progress | None = None) -> ActivationResult:
    """Build the N-account world on the current `default` database, kill one activation attempt mid-transaction,
    time the retried activation and read it back `readback_repeat` times."""
    say = progress or (lambda _msg: None)
    world = build_activation_world(accounts, prefix=prefix, progress=say)
    return _measure(world, accounts, "activation", world.scenario, kill_at=kill_at,
                    readback_repeat=readback_repeat, say=say)


def _measure(world, accounts: int, what: str, scenario: str, *, kill_at: str, readback_repeat: int,
             say) -> ActivationResult:
    """One killed attempt mid-transaction, the timed retry, the readback: the same for every scenario."""
    from bench.stats import Stats

    checkpoint()
    recovery = kill_mid_activation(world, kill_at=kill_at, progress=say)
    if world.barrier_set_pk is not None and _scalar(
            "SELECT state FROM cutover_servingpublicationbarrierset WHERE id = %s", [world.barrier_set_pk]) != "held":
        raise PartialActivationVisible("after the kill the barrier set is no longer held")
    say(f"  locks released {recovery.locks_released_ms:,.1f} ms after the kill; nothing partial visible")
    raw = raw_reference(world)
    say(f"  raw set-based reference (one UPDATE ... RETURNING -> INSERT ... SELECT, rolled back): "
        f"{raw.statement_ms:,.1f} ms for {raw.rows:,} gates, {raw.lanes_locked:,} lanes; retrying")
    phases, wal = timed_activation(world)
    # Recovery ends when the activation is committed again (D-285): for the coordinator, the readback, v2_committed
    # and the release after its COMMIT are the next phase, which an uninterrupted run performs as well.
    recovery.retried_commit_ms = round(recovery.locks_released_ms + (phases.committed_ms or phases.call_ms), 3)
    say(f"  retried {what} committed: transaction {phases.transaction_ms:,.1f} ms, recovery "
        f"{recovery.retried_commit_ms:,.1f} ms; reading back {readback_repeat}x")
    samples = [readback(world) for _ in range(max(1, readback_repeat))]
    return ActivationResult(accounts=accounts, setup_seconds=world.setup_seconds,
                            setup_rows=world.setup_rows, phases=phases, wal=wal, readback_ms=Stats.of(samples),
                            recovery=recovery, rows=activation_rows(world),
                            load_average=round(os.getloadavg()[0], 2), scenario=scenario, raw=raw)


# -- the report -----------------------------------------------------------------------------------------------

def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages * size / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    return f"{os.cpu_count()} CPUs ({model or platform.processor() or platform.machine()}){memory}, {platform.system()}"


@dataclass
class ActivationReport:
    command: str
    kill_at: str
    readback_repeat: int
    results: list[ActivationResult] = field(default_factory=list)
    postgres: str = ""
    settings: dict[str, str] = field(default_factory=dict)
    machine: str = ""
    successor: str = SUCCESSOR_STATUS
    failures: list[dict[str, Any]] = field(default_factory=list)  # cardinalities that could not be measured
    commit: str = ""
    goals: list[dict[str, Any]] = field(default_factory=list)  # bench.activation_goals.check_goals, when checked

    def as_dict(self) -> dict:
        return {"command": self.command, "commit": self.commit, "machine": self.machine, "postgres": self.postgres,
                "settings": self.settings, "kill_at": self.kill_at, "readback_repeat": self.readback_repeat,
                "first_activation": [r.as_dict() for r in self.results if r.scenario == "first"],
                "scenarios": {name: [r.as_dict() for r in self.results if r.scenario == name]
                              for name in SCENARIO_SETS["all"] if any(r.scenario == name for r in self.results)},
                "failures": self.failures, "goals": self.goals,
                "successor_activation": self.successor}


def server_facts() -> tuple[str, dict[str, str]]:
    facts = {}
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        for name in ("shared_buffers", "synchronous_commit", "fsync", "full_page_writes", "wal_level",
                     "max_wal_size", "checkpoint_timeout", "autovacuum", "max_locks_per_transaction",
                     "max_connections"):
            cursor.execute(f"SHOW {name}")
            facts[name] = cursor.fetchone()[0]
    facts["lock_table_capacity"] = str(lock_table_capacity())
    return version, facts


def product_commit() -> str:
    """The checked-out commit, "+modified" when the product (connector/, effects/, cutover/) has uncommitted
    changes (best effort)."""
    from django.conf import settings

    try:
        root = str(Path(settings.BASE_DIR))
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "connector", "effects", "cutover"], cwd=root,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+modified" if dirty else "")


def _n(value, fmt: str = ",.1f") -> str:
    return "-" if value is None else format(value, fmt)


def format_table(report: ActivationReport) -> str:
    head = (f"{'accounts':>9} {'setup s':>8} {'reread ms':>10} {'epoch lock':>10} {'gate locks':>10} "
            f"{'epoch upd':>9} {'gate upd':>10} {'COMMIT':>7} {'txn ms':>10} {'readback p50/p99 ms':>20} "
            f"{'WAL bytes':>12} {'WAL cold':>12} {'row locks':>9} {'pg_locks':>8} {'released ms':>11} "
            f"{'recovery ms':>11} {'raw ms':>8} {'txn/raw':>7}")
    titles = {"first": "first activation (epoch_activate_first), one killed attempt then the timed retry:",
              "cutover": "first activation through the coordinator (first_activation_commit; epoch lock = barrier set, "
                         "journal decision, epoch, evidence), one killed attempt then the timed resume:",
              "successor": "successor activation (succession.successor_activate; epoch lock = barrier set + both "
                           "epochs), one killed attempt then the timed retry:"}
    lines = []
    for scenario, title in titles.items():
        if not any(r.scenario == scenario for r in report.results) and (scenario != "first" or report.results):
            continue
        lines += ([""] if lines else []) + [title, head, "-" * len(head)]
        lines += _table_rows([r for r in report.results if r.scenario == scenario])
    lines += ["", "per account:", (f"{'scenario':>9} {'accounts':>9} {'txn us':>9} {'reread us':>10} "
                                   f"{'readback us':>11} {'WAL B':>8} {'recovery us':>11}")]
    for r in report.results:
        a = r.per_account()
        lines.append(f"{r.scenario:>9} {r.accounts:>9,} {a['transaction_us']:>9,.1f} {a['reread_us']:>10,.1f} "
                     f"{a['readback_us']:>11,.1f} {_n(a['wal_bytes']):>8} {a['recovery_us']:>11,.1f}")
    lines += ["", "WAL of the committed transaction by table (bytes; indexes and TOAST count for their table):"]
    for r in report.results:
        lines.append(f"{r.scenario:>9} {r.accounts:>9,}: "
                     + ", ".join(f"{name} {size:,}" for name, size in r.wal.by_relation.items()))
    for failure in report.failures:
        lines.append(f"{failure['accounts']:>9,} accounts: NOT MEASURED: {failure['error']}")
    lines += ["", f"successor activation: {report.successor}"]
    return "\n".join(lines)


def _table_rows(results: list[ActivationResult]) -> list[str]:
    lines = []
    for r in results:
        p, c = r.phases, r.recovery.census
        lines.append(
            f"{r.accounts:>9,} {r.setup_seconds.get('total', 0):>8,.1f} {p.reread_ms:>10,.1f} "
            f"{p.epoch_lock_ms:>10,.1f} {p.gate_lock_ms:>10,.1f} {p.epoch_update_ms:>9,.1f} "
            f"{p.gate_update_ms:>10,.1f} {p.commit_ms:>7,.1f} {p.transaction_ms:>10,.1f} "
            f"{r.readback_ms.p50:>9,.1f}/{r.readback_ms.p99:>9,.1f} {_n(r.wal.bytes, ','):>12} "
            f"{_n(r.recovery.child_wal.bytes, ','):>12} {_n(c.total_row_locks, ','):>9} {c.total_lock_table:>8,} "
            f"{r.recovery.locks_released_ms:>11,.1f} {_n(r.recovery.retried_commit_ms):>11} "
            f"{_n(None if r.raw is None else r.raw.statement_ms):>8} {_n(r.raw_ratio, ',.2f'):>7}")
    return lines
