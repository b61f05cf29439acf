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

import hashlib
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, connections, transaction

from bench.activation_timing import CHILD_ARGS, CHILD_COMMITTED, CHILD_HOLDING
from bench.wal import Wal, insert_lsn, retain_wal, wal_of

Progress = Callable[[str], None]

SUCCESSOR_STATUS = "--scenario successor (or both, all): cutover.services.succession.successor_activate"
# both: the two real coordinators of issue 19 (cutover, successor); all: every scenario
SCENARIO_CHOICES = ("first", "cutover", "successor", "both", "all")
SCENARIO_SETS = {"both": ("cutover", "successor"), "all": ("first", "cutover", "successor")}
DEFAULT_ACCOUNTS = "1000,10000,100000"
DEFAULT_DATABASE = "connector_bench_act"
KILL_POINTS = ("before_commit", "after_gate_locks")
SERVICE_ACCOUNTS = 2  # authored through the services; every bulk row copies their shape
ACCOUNT_KEY = "acct-"
ACTOR = "bench-activation"
LOCKED_TABLES = ("connector_accountservinggate", "connector_servingepoch")
SUCCESSOR_LOCKED_TABLES = (*LOCKED_TABLES, "cutover_servingpublicationbarrierset", "connector_orderinglane")
LOCKED_TABLES_OF = {"first": LOCKED_TABLES, "cutover": (*LOCKED_TABLES, "cutover_servingpublicationbarrierset"),
                    "successor": SUCCESSOR_LOCKED_TABLES}
BUDGET_FIGURES = ("transaction_ms", "commit_ms", "readback_ms", "wal_bytes", "locks_released_ms", "recovery_ms",
                  "row_locks")


class ActivationBenchError(RuntimeError):
    """The bench could not run the activation as designed (a child that never held its locks, a rejected epoch,
    a readback that does not name the epoch)."""


class PartialActivationVisible(ActivationBenchError):
    """After the activation transaction was killed, some of its writes or locks were visible: whole-service
    atomicity is broken (CV2-14-007)."""


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# -- the world --------------------------------------------------------------------------------------------------

@dataclass
class ActivationWorld:
    accounts: int
    prefix: str
    epoch_pk: int
    epoch_digest: bytes
    configuration_pk: int
    configuration_generation_id: str
    fences: dict[int, int]  # account id -> gate fence before the activation
    credential_generations: int
    setup_seconds: dict[str, float] = field(default_factory=dict)
    setup_rows: int = 0
    extensions: dict[str, bool] = field(default_factory=dict)
    # "first": epoch_pk is the verified epoch, gates v2_validating. "successor": epoch_pk is the verified
    # successor, gates v2_halted on the active predecessor, barrier_set_pk the held barrier set.
    scenario: str = "first"
    gate_mode_before: str = "v2_validating"
    barrier_set_pk: int | None = None
    predecessor_pk: int | None = None
    handoffs: int = 0
    attempt_key: str = ""  # "cutover": the ServiceCutoverAttempt whose first_activation_commit is measured
    lane_pks: list[int] = field(default_factory=list)  # "successor": predecessor and successor lanes it locks


def _timed(seconds: dict[str, float], name: str, fn, *args, **kwargs):
    began = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        seconds[name] = round(time.monotonic() - began, 3)


def _fresh_session() -> None:
    # PostgreSQL caches the plans of its foreign-key checks per session; plans made while the tables were tiny
    # would make each check of a large bulk insert scan the table (see bench history).
    if not connection.in_atomic_block:
        connection.close()


def _copy(cursor, table: str, columns: Sequence[str], rows) -> int:
    count = 0
    with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


BULK_ACCOUNTS_SQL = """
INSERT INTO connector_connectoraccount (account_key, provider_scope, display_name, created_at)
SELECT %(prefix)s || %(key)s || lpad(g::text, %(width)s, '0'), %(scope)s, 'Account ' || g, now()
FROM generate_series(%(lo)s, %(hi)s) g ORDER BY g
"""
# Gates are inserted in their final pre-activation mode: the gate triggers (transition table, fence advance) fire
# BEFORE UPDATE only, and the mode/epoch check constraint holds (v2_validating names no epoch).
BULK_GATES_SQL = """
INSERT INTO connector_accountservinggate (account_id, mode, fence, epoch_id, epoch_digest, changed_at)
SELECT a.id, t.mode, t.fence, NULL, NULL, now()
FROM connector_connectoraccount a, connector_accountservinggate t
WHERE a.id > %(after)s AND t.id = %(template)s ORDER BY a.id
"""
BULK_GATE_AUDIT_SQL = """
INSERT INTO connector_auditrecord (at, actor, entity_type, entity_id, action, from_state, to_state, fence,
    evidence_digest, reason)
SELECT now(), t.actor, t.entity_type, g.id::text, t.action, t.from_state, t.to_state, t.fence, t.evidence_digest,
    t.reason
FROM connector_accountservinggate g
CROSS JOIN (SELECT * FROM connector_auditrecord WHERE entity_type = 'connector.AccountServingGate'
            AND entity_id = %(template)s) t
WHERE g.account_id > %(after)s ORDER BY g.id, t.id
"""
BULK_DISPATCH_GATES_SQL = """
INSERT INTO connector_credentialgenerationdispatchgate (credential_generation_id, mode, fence, changed_at)
SELECT id, 'enabled', 1, now() FROM connector_credentialgeneration WHERE id > %(after)s ORDER BY id
"""
BULK_CREDENTIAL_AUDIT_SQL = """
INSERT INTO connector_auditrecord (at, actor, entity_type, entity_id, action, from_state, to_state, fence,
    evidence_digest, reason)
SELECT now(), %(actor)s, 'connector.CredentialGeneration', c.id::text, 'credential_generation_create', '', '',
    NULL, c.receipt_digest, ''
FROM connector_credentialgeneration c WHERE c.id > %(after)s
UNION ALL
SELECT now(), %(actor)s, 'connector.CredentialGenerationDispatchGate', d.id::text, 'credential_gate_create', '',
    d.mode, d.fence, NULL, ''
FROM connector_credentialgenerationdispatchgate d WHERE d.credential_generation_id > %(after)s
"""
BULK_MAPPINGS_SQL = """
INSERT INTO connector_serviceconfigurationcredentialmapping (generation_id, account_id, credential_ref,
    credential_generation_id)
SELECT %(configuration)s, c.account_id, c.credential_identity, c.id
FROM connector_credentialgeneration c WHERE c.account_id = ANY(%(accounts)s)
"""


def _scalar(sql: str, params: Sequence[Any] | dict | None = None):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def _bulk_accounts_and_gates(*, prefix: str, width: int, first: int, last: int, template_gate, say: Progress) -> int:
    """Accounts first..last with their gates (v2_validating) and the template gate's audit trail each."""
    if last < first:
        return 0
    _fresh_session()
    after = _scalar("SELECT coalesce(max(id), 0) FROM connector_connectoraccount")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
        cursor.execute(BULK_ACCOUNTS_SQL, {"prefix": prefix, "key": ACCOUNT_KEY, "width": width, "lo": first,
                                           "hi": last, "scope": template_gate.account.provider_scope})
        accounts = cursor.rowcount
        cursor.execute(BULK_GATES_SQL, {"after": after, "template": template_gate.pk})
        gates = cursor.rowcount
        cursor.execute(BULK_GATE_AUDIT_SQL, {"after": after, "template": str(template_gate.pk)})
        audits = cursor.rowcount
    say(f"  bulk: {accounts:,} accounts, {gates:,} gates (v2_validating, fence {template_gate.fence}), "
        f"{audits:,} gate audit rows")
    return accounts + gates + audits


def _write_secrets(root: Path, items: list[tuple[str, str, bytes]]) -> None:
    for ref, version_ref, secret in items:
        path = root / version_ref
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # write-once, as the backend does
        with os.fdopen(fd, "wb") as handle:
            handle.write(secret)


def _bulk_credentials(*, account_ids_after: int, refs: Sequence[str], template, say: Progress) -> int:
    """Two credential generations (one per CredentialRef of the Catalog view) for every bulk account, with the
    secret version files, the receipts of connector.receipts.credential_receipt, the dispatch gates (`enabled`,
    fence 1) and the two audit rows credential_generation_create writes."""
    from django.conf import settings
    from django.utils import timezone

    from connector import receipts
    from connector.secrets import secret_backend

    backend = secret_backend()
    root = Path(settings.CONNECTOR["SECRET_BACKEND_DIR"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, account_key, provider_scope FROM connector_connectoraccount WHERE id > %s "
                       "ORDER BY id", [account_ids_after])
        accounts = cursor.fetchall()
    if not accounts:
        return 0
    next_version = {}
    for ref in refs:
        (root / ref).mkdir(parents=True, exist_ok=True, mode=0o700)
        versions = [int(p.name[1:]) for p in (root / ref).glob("v*") if p.name[1:].isdigit()]
        next_version[ref] = 1 + max(versions, default=0)
    transport_digest = bytes(template.transport_config_digest)
    now = timezone.now()
    rows, secrets = [], []
    for account_id, account_key, scope in accounts:
        for ref in refs:
            generation_id = f"{account_key}.{ref}.g1"
            version_ref = f"{ref}/v{next_version[ref]}"
            next_version[ref] += 1
            backend._path(version_ref)  # the backend's own reference check
            secrets.append((ref, version_ref,
                            hashlib.sha256(f"demo-secret:{generation_id}".encode()).hexdigest().encode()))
            receipt, receipt_digest = receipts.credential_receipt(
                generation_id=generation_id, credential_identity=ref, provider_scope=scope, account_key=account_key,
                secret_version_ref=version_ref, transport_config_digest=transport_digest)
            rows.append((generation_id, ref, scope, account_id, version_ref, transport_digest,
                         receipts.CREDENTIAL_RECEIPT_PROTOCOL, receipt, receipt_digest, now))
    _write_secrets(root, secrets)
    _fresh_session()
    after = _scalar("SELECT coalesce(max(id), 0) FROM connector_credentialgeneration")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit = off")
        generations = _copy(cursor, "connector_credentialgeneration",
                            ("generation_id", "credential_identity", "provider_scope", "account_id",
                             "secret_version_ref", "transport_config_digest", "receipt_protocol", "receipt",
                             "receipt_digest", "created_at"), rows)
        cursor.execute(BULK_DISPATCH_GATES_SQL, {"after": after})
        gates = cursor.rowcount
        cursor.execute(BULK_CREDENTIAL_AUDIT_SQL, {"after": after, "actor": f"system:{ACTOR}"})
        audits = cursor.rowcount
    say(f"  bulk: {generations:,} credential generations ({len(secrets):,} secret files), {gates:,} dispatch "
        f"gates, {audits:,} audit rows")
    return generations + gates + audits


def _bulk_configuration(*, generation_id: str, view, member_ids: list[int], template_account, say: Progress):
    """One configuration generation over `member_ids` (canonical order: account key), its accounts (the template
    account's routes, mapping selections and policy values) and the exhaustive credential relation of their
    generations; payload, digest and receipt by connector.receipts exactly as service_configuration_create."""
    from connector import receipts
    from connector.actors import Actor
    from connector.models import ServiceConfigurationGeneration
    from connector.services.audit import audit_record
    from connector.services.owners import GENERATION_PROTOCOL

    with connection.cursor() as cursor:
        cursor.execute("SELECT id, account_key, provider_scope FROM connector_connectoraccount WHERE id = ANY(%s)",
                       [member_ids])
        members = sorted(cursor.fetchall(), key=lambda row: row[1])
        cursor.execute("SELECT a.account_key, c.credential_identity, c.generation_id "
                       "FROM connector_credentialgeneration c JOIN connector_connectoraccount a ON a.id = c.account_id "
                       "WHERE c.account_id = ANY(%s)", [member_ids])
        relation = [tuple(row) for row in cursor.fetchall()]
    routes = list(template_account.enabled_routes)
    selections, policy = template_account.mapping_selections, template_account.policy_values
    account_dicts = [{"account_key": key, "provider_scope": scope, "enabled_routes": routes,
                      "mapping_selections": selections, "policy_values": policy} for _id, key, scope in members]
    payload = receipts.configuration_payload(generation_id=generation_id, catalog_view_key=view.view_key,
                                             catalog_revision=view.revision, accounts=account_dicts,
                                             relation=relation)
    digest = receipts.sha256(payload)
    receipt, receipt_digest = receipts.configuration_receipt(generation_protocol=GENERATION_PROTOCOL,
                                                             generation_id=generation_id, generation_digest=digest)
    _fresh_session()
    with transaction.atomic():
        config = ServiceConfigurationGeneration.objects.create(
            generation_id=generation_id, generation_protocol=GENERATION_PROTOCOL,
            receipt_protocol=receipts.CONFIGURATION_RECEIPT_PROTOCOL, catalog_view=view, payload=payload,
            generation_digest=digest, receipt=receipt, receipt_digest=receipt_digest)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit = off")
            accounts = _copy(cursor, "connector_serviceconfigurationaccount",
                             ("generation_id", "ordinal", "account_id", "enabled_routes", "mapping_selections",
                              "policy_values"),
                             ((config.pk, ordinal, account_id, json.dumps(routes), json.dumps(selections),
                               json.dumps(policy)) for ordinal, (account_id, _key, _scope) in enumerate(members)))
            cursor.execute(BULK_MAPPINGS_SQL, {"configuration": config.pk, "accounts": member_ids})
            mappings = cursor.rowcount
        audit_record(actor=Actor.system(ACTOR), entity=config, action="service_configuration_create",
                     evidence_digest=receipt_digest)
    say(f"  bulk: configuration {generation_id}: {accounts:,} accounts, {mappings:,} credential mappings, payload "
        f"{len(payload):,} bytes")
    return config, 1 + accounts + mappings + 1


def _ensure_extensions() -> dict[str, bool]:
    available = {}
    for name in ("pgrowlocks", "pg_walinspect"):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"CREATE EXTENSION IF NOT EXISTS {name}")
            available[name] = True
        except DatabaseError:  # not a superuser, or the contrib package is missing: the figure is then omitted
            available[name] = False
    return available


def gate_fences(configuration_pk: int) -> dict[int, tuple[str, int, int | None, bytes | None]]:
    """account id -> (mode, fence, epoch id, epoch digest) of every gate of the configuration's account set."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT g.account_id, g.mode, g.fence, g.epoch_id, g.epoch_digest "
                       "FROM connector_accountservinggate g JOIN connector_serviceconfigurationaccount c "
                       "ON c.account_id = g.account_id WHERE c.generation_id = %s", [configuration_pk])
        return {row[0]: (row[1], row[2], row[3], None if row[4] is None else bytes(row[4]))
                for row in cursor.fetchall()}


def build_activation_world(accounts: int, *, prefix: str = "", progress: Progress | None = None) -> ActivationWorld:
    """On the current `default` database: the owners of an N-account service and a verified ServingEpoch over them,
    every gate `v2_validating` (see the module docstring for which rows come from services and which from bulk
    SQL). Requires accounts >= 1."""
    from connector.actors import Actor
    from connector.choices import EpochState, GateMode
    from connector.demo import build_owners, walk_gates_to_validating
    from connector.selectors import owners as owner_readers
    from connector.services import serving

    if accounts < 1:
        raise ActivationBenchError("the activation needs at least one account")
    say = progress or (lambda _msg: None)
    actor = Actor.system(ACTOR)
    seconds: dict[str, float] = {}
    width = max(7, len(str(accounts)))
    service_keys = tuple(f"{ACCOUNT_KEY}{i:0{width}d}" for i in range(1, min(SERVICE_ACCOUNTS, accounts) + 1))
    began = time.monotonic()
    say(f"{accounts:,} accounts: authoring packs, Catalog view and {len(service_keys)} template accounts through "
        "the services")

    def services():
        owners_world = build_owners(prefix, account_keys=service_keys, actor=actor)
        walk_gates_to_validating(owners_world, actor)
        return owners_world

    owners_world = _timed(seconds, "services", services)
    extensions = _ensure_extensions()
    template_gate = owners_world.accounts[0].serving_gate
    template_gate.refresh_from_db()
    if template_gate.mode != GateMode.V2_VALIDATING:
        raise ActivationBenchError(f"the template gate is {template_gate.mode}, not v2_validating")
    template_credential = owners_world.accounts[0].credential_generations.order_by("pk").first()
    template_account = owners_world.configuration.accounts.order_by("ordinal").first()
    refs = sorted({ref for b in owner_readers.catalog_view_read_exact(
        view_key=owners_world.view.view_key, revision=owners_world.view.revision).bindings for ref in b.credential_refs})
    after = _scalar("SELECT coalesce(max(id), 0) FROM connector_connectoraccount")
    rows = _timed(seconds, "accounts_gates", _bulk_accounts_and_gates, prefix=prefix, width=width,
                  first=len(service_keys) + 1, last=accounts, template_gate=template_gate, say=say)
    rows += _timed(seconds, "credentials", _bulk_credentials, account_ids_after=after, refs=refs,
                   template=template_credential, say=say)
    member_ids = [a.pk for a in owners_world.accounts] + list(
        _account_ids_after(after))
    if len(member_ids) != accounts:
        raise ActivationBenchError(f"built {len(member_ids)} accounts, wanted {accounts}")
    config, config_rows = _timed(seconds, "configuration", _bulk_configuration,
                                 generation_id=f"{prefix}activation-config.g1", view=owners_world.view,
                                 member_ids=member_ids, template_account=template_account, say=say)
    rows += config_rows
    _timed(seconds, "analyze", _analyze)
    say("  configuration reread by service_configuration_read")
    fact = _timed(seconds, "configuration_read", owner_readers.service_configuration_read,
                  generation_id=config.generation_id)
    if len(fact.account_keys) != accounts or len(fact.relation) != accounts * len(refs):
        raise ActivationBenchError(f"configuration read back {len(fact.account_keys)} accounts and "
                                   f"{len(fact.relation)} mappings")
    say(f"  epoch: prepare from owners ({len(fact.relation):,} credential generations reread)")
    epoch = _timed(seconds, "epoch_prepare", serving.epoch_prepare_from_owners,
                   epoch_id=f"{prefix}activation-epoch", configuration_generation_id=config.generation_id,
                   actor=actor)
    say("  epoch: verify (every owner reread)")
    epoch = _timed(seconds, "epoch_verify", serving.epoch_verify, epoch_pk=epoch.pk, actor=actor)
    if epoch.state != EpochState.VERIFIED:
        raise ActivationBenchError(f"epoch verification refused: {epoch.rejection_code} {epoch.rejection_detail}")
    _timed(seconds, "analyze_after_epoch", _analyze)
    gates = gate_fences(config.pk)
    not_ready = [a for a, (mode, *_rest) in gates.items() if mode != GateMode.V2_VALIDATING]
    if len(gates) != accounts or not_ready:
        raise ActivationBenchError(f"{len(gates)} gates, not v2_validating: {not_ready[:10]}")
    seconds["total"] = round(time.monotonic() - began, 3)
    say(f"  setup done in {seconds['total']:,.1f} s ({rows:,} bulk rows)")
    return ActivationWorld(accounts=accounts, prefix=prefix, epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest),
                           configuration_pk=config.pk, configuration_generation_id=config.generation_id,
                           fences={a: fence for a, (_mode, fence, *_rest) in gates.items()},
                           credential_generations=len(fact.relation), setup_seconds=seconds, setup_rows=rows,
                           extensions=extensions)


def _account_ids_after(after: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM connector_connectoraccount WHERE id > %s ORDER BY id", [after])
        return [row[0] for row in cursor.fetchall()]


def _analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


LOCK_TABLE_CAPACITY_SQL = """
SELECT current_setting('max_locks_per_transaction')::int * (current_setting('max_connections')::int
    + current_setting('autovacuum_max_workers')::int + 1 + current_setting('max_worker_processes')::int
    + current_setting('max_wal_senders')::int + current_setting('max_prepared_transactions')::int)
"""


def lock_table_capacity() -> int:
    """PostgreSQL's nominal shared lock table: max_locks_per_transaction x (max backends + prepared transactions).
    Every heavyweight lock that is not fast-path (advisory locks, for one) takes an entry until its transaction
    ends; row locks do not (they live in the tuples)."""
    return int(_scalar(LOCK_TABLE_CAPACITY_SQL))


def checkpoint() -> None:
    """A CHECKPOINT, so that the killed attempt starts cold: its first change of every page writes a full-page
    image, the worst case of the transaction's WAL."""
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")


# -- a second session -----------------------------------------------------------------------------------------

def _conninfo(settings_dict: dict) -> dict:
    return {"host": settings_dict.get("HOST") or None, "port": settings_dict.get("PORT") or None,
            "user": settings_dict.get("USER") or None, "password": settings_dict.get("PASSWORD") or None,
            "dbname": settings_dict["NAME"]}


def _url(settings_dict: dict) -> str:
    from urllib.parse import quote

    user = quote(settings_dict.get("USER") or "postgres", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}" if password else user
    return (f"postgres://{auth}@{settings_dict.get('HOST') or '127.0.0.1'}:{settings_dict.get('PORT') or 5432}/"
            f"{settings_dict['NAME']}")


def _observer():
    """An autocommit session of its own on the same database: it sees only committed data and other sessions'
    locks, as any other client would."""
    import psycopg

    return psycopg.connect(**_conninfo(connection.settings_dict), autocommit=True)


# -- 1. killed mid-transaction --------------------------------------------------------------------------------

@dataclass
class LockCensus:
    point: str  # where the transaction was paused
    row_locks: dict[str, int]  # table -> rows locked by the transaction (pgrowlocks); empty without it
    lock_table: dict[str, int]  # "locktype mode" -> pg_locks entries of its backend

    @property
    def total_row_locks(self) -> int | None:
        return sum(self.row_locks.values()) if self.row_locks else None

    @property
    def total_lock_table(self) -> int:
        return sum(self.lock_table.values())


@dataclass
class Untouched:
    """What a second session sees after the kill."""

    epoch_state: str
    gates: int
    gates_validating: int  # gates still in the scenario's pre-activation mode (v2_validating, or v2_halted)
    gates_naming_epoch: int
    fences_changed: int
    activation_audit_rows: int
    rows_still_locked: int | None

    def partial(self, accounts: int) -> bool:
        return not (self.epoch_state == "verified" and self.gates == self.gates_validating == accounts
                    and self.gates_naming_epoch == 0 and self.fences_changed == 0
                    and self.activation_audit_rows == 0 and not self.rows_still_locked)


@dataclass
class Recovery:
    kill_at: str
    census: LockCensus
    untouched: Untouched
    locks_released_ms: float  # SIGKILL -> the backend is gone and with it every lock
    child_wal: Wal  # what the killed attempt had written (after a CHECKPOINT: full-page images included)
    # SIGKILL -> the retried activation's COMMIT acknowledged, when the retry starts as soon as the locks are gone:
    # locks_released_ms + the retry's whole call (the bench's own checks in between are not counted)
    retried_commit_ms: float | None = None
    partial_visible: bool = False


ACTIVATION_ACTIONS = {"first": ("epoch_activate_first", "gate_activate_first"),
                      "cutover": ("epoch_activate_first", "gate_activate_first"),
                      "successor": ("successor_activate", "gate_activate_successor")}


CHILD_SCRIPT = """\
import django
django.setup()
from bench.activation_timing import child_main
child_main()
"""



def _spawn_child(world: ActivationWorld, kill_at: str) -> subprocess.Popen:
    from django.conf import settings

    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "JOURNAL_DATABASE_URL", "TEST_DB_SUFFIX", "CONNECTOR_FAULT_POINT")}
    root = str(Path(settings.BASE_DIR))
    env.update({
        "DJANGO_SETTINGS_MODULE": (os.environ.get("DJANGO_SETTINGS_MODULE") or getattr(settings, "SETTINGS_MODULE", None)
                                   or "config.django.local"),
        "DJANGO_DEBUG": "0",
        "DATABASE_URL": _url(connection.settings_dict),
        "JOURNAL_DATABASE_URL": _url(connections["journal"].settings_dict),
        "CONNECTOR_SECRET_DIR": str(settings.CONNECTOR["SECRET_BACKEND_DIR"]),
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH", "")])),
        CHILD_ARGS: json.dumps({"epoch_pk": world.epoch_pk, "accounts": world.accounts, "kill_at": kill_at,
                                "scenario": world.scenario, "barrier_set_pk": world.barrier_set_pk,
                                "attempt_key": world.attempt_key}),
    })
    return subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT], env=env, cwd=root, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _await_holding(child: subprocess.Popen, timeout: float) -> dict:
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def pump(stream, sink) -> None:
        for line in stream:
            sink(line)
        if stream is child.stdout:
            lines.put(None)

    threading.Thread(target=pump, args=(child.stdout, lines.put), daemon=True).start()
    threading.Thread(target=pump, args=(child.stderr, errors.append), daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ActivationBenchError(f"the activation child did not reach its kill point in {timeout:.0f} s")
        if line is None:
            child.wait()
            raise ActivationBenchError(f"the activation child exited ({child.returncode}) before its kill point:\n"
                                       + "".join(errors[-30:]))
        if line.startswith(CHILD_HOLDING):
            return json.loads(line[len(CHILD_HOLDING):])
        if line.startswith(CHILD_COMMITTED):
            raise ActivationBenchError(f"the activation child committed without pausing: {line.strip()}")


def _census(observer, *, point: str, pid: int, xid: int, rowlocks: bool,
            tables: Sequence[str] = LOCKED_TABLES) -> LockCensus:
    lock_table = {f"{locktype} {mode}": count for locktype, mode, count in observer.execute(
        "SELECT locktype, mode, count(*) FROM pg_locks WHERE pid = %s GROUP BY 1, 2 ORDER BY 1, 2", [pid])}
    row_locks = {}
    if rowlocks:
        for table in tables:
            row_locks[table] = observer.execute(
                "SELECT count(*) FROM pgrowlocks(%s) WHERE %s::text::xid = ANY(xids)", [table, str(xid)]).fetchone()[0]
    return LockCensus(point=point, row_locks=row_locks, lock_table=lock_table)


def observe_untouched(observer, world: ActivationWorld, *, xid: int | None = None,
                      rowlocks: bool = True) -> Untouched:
    """The epoch's state and every gate of the configuration, as a second session sees them."""
    (state,) = observer.execute("SELECT state FROM connector_servingepoch WHERE id = %s", [world.epoch_pk]).fetchone()
    gates = observer.execute(
        "SELECT g.account_id, g.mode, g.fence, g.epoch_id FROM connector_accountservinggate g "
        "JOIN connector_serviceconfigurationaccount c ON c.account_id = g.account_id WHERE c.generation_id = %s",
        [world.configuration_pk]).fetchall()
    (audits,) = observer.execute(
        "SELECT count(*) FROM connector_auditrecord WHERE action = ANY(%s) AND evidence_digest = %s",
        [list(ACTIVATION_ACTIONS[world.scenario]), world.epoch_digest]).fetchone()
    still_locked = None
    if rowlocks and xid is not None:
        still_locked = sum(observer.execute(
            "SELECT count(*) FROM pgrowlocks(%s) WHERE %s::text::xid = ANY(xids)", [table, str(xid)]).fetchone()[0]
            for table in LOCKED_TABLES_OF[world.scenario])
    return Untouched(
        epoch_state=state, gates=len(gates), gates_validating=sum(1 for g in gates if g[1] == world.gate_mode_before),
        gates_naming_epoch=sum(1 for g in gates if g[3] == world.epoch_pk),
        fences_changed=sum(1 for g in gates if world.fences.get(g[0]) != g[2]), activation_audit_rows=audits,
        rows_still_locked=still_locked)


def kill_mid_activation(world: ActivationWorld, *, kill_at: str = "before_commit", progress: Progress | None = None,
                        timeout: float | None = None, raise_on_partial: bool = True) -> Recovery:
    """Run `epoch_activate_first` in a child process, pause it at `kill_at` holding its locks, count them from a
    second session, SIGKILL it and time until its backend (and with it every lock) is gone. Then, from the second
    session: the WAL the killed attempt wrote and what is visible. Raises PartialActivationVisible when any of the
    activation's effects or locks remain visible (unless raise_on_partial is false)."""
    if kill_at not in KILL_POINTS:
        raise ActivationBenchError(f"kill point {kill_at!r} is not one of {', '.join(KILL_POINTS)}")
    say = progress or (lambda _msg: None)
    timeout = timeout if timeout is not None else 300 + world.accounts * 0.02
    rowlocks = world.extensions.get("pgrowlocks", False)
    observer = _observer()
    child = None
    try:
        retain_wal(observer)
        start_lsn = insert_lsn(observer)
        say(f"  killed attempt: child runs the {world.scenario} activation and pauses at {kill_at}")
        child = _spawn_child(world, kill_at)
        holding = _await_holding(child, timeout)
        census = _census(observer, point=holding["point"], pid=holding["pid"], xid=holding["xid"],
                         rowlocks=rowlocks,
                         tables=LOCKED_TABLES_OF[world.scenario])
        say(f"  killed attempt: holding {census.total_row_locks} row locks, {census.total_lock_table} lock-table "
            "entries; SIGKILL")
        killed = time.perf_counter()
        os.kill(child.pid, signal.SIGKILL)
        while observer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                               [holding["pid"]]).fetchone()[0]:
            time.sleep(0.0005)
        released = time.perf_counter()
        child.wait()
        server_bytes = observer.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)::bigint",
                                        [start_lsn]).fetchone()[0]
        child_wal = wal_of(observer, start_lsn, holding["xid"], server_bytes=server_bytes,
                            enabled=world.extensions.get("pg_walinspect", False))
        untouched = observe_untouched(observer, world, xid=holding["xid"], rowlocks=rowlocks)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        observer.close()
    recovery = Recovery(kill_at=kill_at, census=census, untouched=untouched,
                        locks_released_ms=_ms(released - killed), child_wal=child_wal,
                        partial_visible=untouched.partial(world.accounts))
    if recovery.partial_visible and raise_on_partial:
        raise PartialActivationVisible(f"after the kill at {kill_at}: {untouched}")
    return recovery


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
    from bench.management.commands.bench import Stats

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


def _coordinator(name: str) -> Callable[..., ActivationResult]:
    def measure(*args, **kwargs) -> ActivationResult:
        from bench import activation_coord

        return getattr(activation_coord, name)(*args, **kwargs)
    measure.__name__ = name
    return measure


# The activation scenarios (--scenario) and their measuring functions; each reuses kill_mid_activation,
# timed_activation and readback, which pick the service call from world.scenario. Budgets are keyed by scenario
# ("first" at the top of the section, as before; the others under their own key).
SCENARIOS: dict[str, Callable[..., ActivationResult]] = {"first": measure_activation,
                                                          "cutover": _coordinator("measure_cutover"),
                                                          "successor": _coordinator("measure_successor")}
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
                              for name in SCENARIOS if any(r.scenario == name for r in self.results)},
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


# -- budgets, goals and the subcommand: bench/activation_goals.py and bench/activation_command.py ------------

class Activation:
    """`bench activation`: registered in bench/management/commands/bench.py's SUBCOMMANDS (bench/activation_command)."""

    name = "activation"
    help = ("Whole-service activation at N accounts (first: epoch_activate_first; cutover: the V1 -> V2 coordinator's "
            "first_activation_commit through the barrier set and the CutoverDecision; successor: successor_activate "
            "with K lanes per account handed off), in a throwaway database per N: owner reread, locked transaction, "
            "COMMIT, readback, WAL, locks held, recovery after a kill mid-transaction, and the raw set-based shape "
            "of the same rows; --check against the 'activation' section of bench/budgets.json (ceilings and goals), "
            "--chart draws cost against N.")

    def add_arguments(self, parser) -> None:
        from bench.activation_command import add_arguments

        add_arguments(parser)

    def handle(self, command, options: dict) -> None:
        from bench.activation_command import handle

        handle(command, options)


# Split out of this module (it may not grow, tests/test_layout.py); re-exported for their callers. Imported last:
# they import this module.
from bench.activation_goals import (  # noqa: E402,F401
    BUDGET_SECTION,
    DURATION_HEADROOM,
    SMALL_DURATION_FLOOR_MS,
    WAL_HEADROOM,
    check_budgets,
    load_budgets,
    suggest_budgets,
)
from bench.activation_timing import Phases, child_main, timed_activation  # noqa: E402,F401
