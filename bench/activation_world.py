"""The N-account world of `bench activation`: the accounts, gates, credentials and service configuration, a few
through the services and the rest copied in bulk from their shape, on the current `default` database."""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection, transaction


Progress = Callable[[str], None]

SERVICE_ACCOUNTS = 2  # authored through the services; every bulk row copies their shape

ACCOUNT_KEY = "acct-"

ACTOR = "bench-activation"


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
