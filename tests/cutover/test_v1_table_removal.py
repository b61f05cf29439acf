"""Removing the retired V1 tables (CV2-12-078): refused, with stable codes and nothing changed, while V1 is not
retired or any tombstone, ordering baseline, replay predecessor or audit retention still depends on them; then one
audited transaction drops them all, and the V2 paths (admission, a V1 duplicate answered by its tombstone,
materialization, execution, the cutover console) still work; no V2 module imports the V1 runtime."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from connector.models import AuditRecord
from connector.services import admission, materialize
from connector.services.tombstones import tombstones_import
from cutover.errors import V1RemovalRefused
from cutover.models import AttemptOutcome, ServiceCutoverAttempt, V1TableRemoval
from cutover.ports import v1_owner
from cutover.services import first_activation as fa
from cutover.services import v1_removal
from cutover.services.cutover_phases import attempt_phases
from tests import dbroles
from tests.connector.inbound_helpers import drain as v2_drain
from tests.cutover.v1_world import ACTOR, approve_activation, build_v1_world, to_validating

TX = pytest.mark.django_db(databases=["default", "journal"], transaction=True)
CHANNEL = "records.webhook"
V2_DIRS = ("connector", "effects", "cutover", "governance", "observability", "config")


pytestmark = pytest.mark.usefixtures("cutover_env")  # tests/cutover/conftest.py


def event_body(key: str, record: str, sequence: int) -> bytes:
    return json.dumps({"events": [{"id": f"ev-{key}", "type": "record.updated", "record_id": record,
                                   "sequence": sequence, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"N {key}", "email": f"{key}@example.com"}}]},
                      sort_keys=True).encode()


def present() -> list[str]:
    return v1_removal._present(v1_owner().tables())


def refused(*, admin: bool = True) -> list[str]:
    with pytest.raises(V1RemovalRefused) as info:
        if admin:
            with dbroles.as_admin():
                v1_removal.v1_tables_remove(reason="cutover done", actor=ACTOR)
        else:
            v1_removal.v1_tables_remove(reason="cutover done", actor=ACTOR)
    assert info.value.code == "V1_REMOVAL_REFUSED"
    assert sorted(present()) == sorted(v1_owner().tables()) and not V1TableRemoval.objects.exists()
    return info.value.context["reasons"]


def staged(sql: str, params=()) -> None:
    """As the administrator with every trigger off (V1 is read-only by trigger after v2_committed; tombstones are
    append-only): stage a dependency, or take it away again."""
    with dbroles.as_admin(), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(sql, params)


@TX
def test_v1_tables_are_removed_only_once_nothing_depends_on_them(settings):
    """Before the first v2_committed the removal refuses (`v1_not_retired`); after it, while the audit retention
    has not passed (`audit_retention_pending`), as the application role (`not_table_owner`), and while a V1 work
    item has no exact tombstone (`tombstone_missing`), a drained high-water has no OrderingBaseline
    (`baseline_missing`) or a tombstone names a V1 predecessor that does not match it
    (`replay_predecessor_unresolved`), each a database query. Every refusal changes nothing. Then one audited
    transaction records each table's rows and digest and drops every V1 table; rerunning returns the same record.
    With the tables gone, the V2 paths still run: a V1 transport duplicate is answered by its tombstone, a new
    delivery is admitted, materialized and executed, and the cutover console reads the committed attempt.
    Proves: CV2-12-078"""
    world = build_v1_world()
    world.accept(0, "k1", 1, source=CHANNEL)
    world.accept(1, "k2", 1, source=CHANNEL)
    assert refused() == ["v1_not_retired"]
    to_validating(world)
    fa.first_activation_acquire(attempt_key="att-1", actor=ACTOR)
    fa.first_activation_hold(attempt_key="att-1", actor=ACTOR)
    approve_activation(world.epoch.epoch_id)
    fa.first_activation_commit(attempt_key="att-1", actor=ACTOR)
    attempt = ServiceCutoverAttempt.objects.get(attempt_key="att-1")
    assert attempt.outcome == AttemptOutcome.V2_COMMITTED

    assert refused() == ["audit_retention_pending"]  # the V2 commit is younger than the 90-day default
    settings.CUTOVER_V1_AUDIT_RETENTION_SECONDS = 0
    assert refused(admin=False) == ["not_table_owner"]  # the application role owns no V1 table

    staged("INSERT INTO v1_v1workitem (account_key, source_key, transport_key, payload, payload_digest, route_key, "
           "partition, position, state, lease_generation, created_at) VALUES (%s, %s, 'late', '\\x00', %s, "
           "'records.webhook', 'rec-9', 1, 'done', '', now())", [world.keys[0], CHANNEL, b"\0" * 32])
    staged("INSERT INTO v1_v1highwater (account_key, route_key, partition, high_water, comparator) "
           "VALUES (%s, 'records.webhook', 'rec-unbaselined', 7, 'integer')", [world.keys[0]])
    with dbroles.as_admin():
        tombstones_import(rows=[{"account": world.keys[1], "channel": CHANNEL, "transport_key": "forged",
                                 "payload_digest": b"\1" * 32, "predecessor_ref": "v1:workitem:999999"}], actor=ACTOR)
    assert refused() == ["tombstone_missing", "baseline_missing", "replay_predecessor_unresolved"]
    with dbroles.as_admin(), pytest.raises(
            CommandError, match="V1_REMOVAL_REFUSED: tombstone_missing, baseline_missing, replay_predecessor"):
        call_command("v1_tables", "check")
    staged("DELETE FROM v1_v1workitem WHERE transport_key = 'late'")
    staged("DELETE FROM v1_v1highwater WHERE partition = 'rec-unbaselined'")
    staged("DELETE FROM connector_receiptadmissionkey WHERE transport_key = 'forged'")
    staged("DELETE FROM connector_v1acceptancetombstone WHERE transport_key = 'forged'")
    with dbroles.as_admin():
        assert v1_removal.v1_removal_dependencies() == []

    with dbroles.as_admin(), connection.cursor() as cursor:
        counts = {}
        for table in v1_owner().tables():
            cursor.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cursor.fetchone()[0]
    with transaction.atomic():  # rolled back at the end: the rest of the suite still needs the V1 tables
        with dbroles.as_admin():
            removal = v1_removal.v1_tables_remove(reason="retention passed", actor=ACTOR)
            assert v1_removal.v1_tables_remove(reason="again", actor=ACTOR) == removal  # idempotent
        assert present() == []
        assert {t: rows for t, rows, _ in removal.tables} == counts and counts["v1_v1workitem"] == 2
        assert removal.attempt_id == attempt.pk
        assert AuditRecord.objects.filter(action="v1_tables_removed", reason="retention passed").count() == 1

        duplicate = admission.receipt_admit(account_key=world.keys[0], channel=CHANNEL, transport_key="k1",
                                            body=b'{"id":"k1","sequence":1}', actor=ACTOR)
        assert duplicate.outcome == "v1_accepted" and duplicate.receipt is None  # the tombstone, not V1
        created = admission.receipt_admit(account_key=world.keys[0], channel=CHANNEL, transport_key="v2-1",
                                          body=event_body("v2-1", "rec-1", 5), actor=ACTOR)
        assert created.outcome == "created"
        materialize.receipt_materialize(receipt_pk=created.receipt.pk)
        ran = v2_drain()
        assert ran and all(e.state == "completed" for e in ran)
        assert [p.status for p in attempt_phases(ServiceCutoverAttempt.objects.get(pk=attempt.pk))]
        transaction.set_rollback(True)
    assert sorted(present()) == sorted(v1_owner().tables())


def test_no_v2_module_imports_the_v1_runtime():
    """No module of the V2 product (the four apps, observability, config) imports the `v1` app: the coordinator
    reaches V1 only through cutover.ports (settings.CUTOVER_V1_OWNER names it), so once the V1 tables are removed
    nothing in V2 code reads them, and the port's table list covers every V1 model. Proves: CV2-12-078"""
    base = Path(django_settings.BASE_DIR)
    offenders = []
    for name in V2_DIRS:
        for path in sorted((base / name).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                offenders += [f"{path.relative_to(base)}:{node.lineno} {m}" for m in modules
                              if m == "v1" or m.startswith("v1.")]
    assert offenders == []
    from django.apps import apps

    assert set(v1_owner().tables()) == {m._meta.db_table for m in apps.get_app_config("v1").get_models()}
