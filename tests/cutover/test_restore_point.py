"""V1RestorePoint capture and isolated rehearsal against the real PostgreSQL with real pg_dump / pg_restore."""
from __future__ import annotations

import os

import pytest
from django.db import IntegrityError, ProgrammingError, connections, transaction

from config.routers import JOURNAL_DB
from connector.choices import OrderingContract
from connector.models import OrderingLane
from cutover.errors import RestorePointInvalid, RestorePointRefused
from cutover.models import RestorePointRehearsal, V1RestorePoint, V1ShutdownCertificate
from cutover.ports import v1_owner
from cutover.services import pg_snapshot
from cutover.services.restore_point import restore_point_capture, restore_point_rehearse
from tests.cutover.restore_fixtures import TX, restore_env  # noqa: F401 (autouse fixture)
from tests.cutover.restore_helpers import (
    build_owners, drain, drained_world, open_attempt, seed_v1, v1_cursors,
)
from v1.errors import V1BootCheckFailed
from v1.models import RELEASE_ID, V1SourceCursor
from tests import dbroles

def scratch_databases() -> list[str]:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s",
                       [connections["default"].settings_dict["NAME"] + "_rehearse_%"])
        return [r[0] for r in cursor.fetchall()]


@TX
def test_capture_freezes_every_digest_in_the_journal_and_the_dump_matches():
    """Proves: CV2-12-050, CV2-12-051, CV2-12-093 (a drained, V2-untouched snapshot, its receipt in the journal
    database, the dump named by sha256 and size, digests computed in the snapshot dumped)."""
    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    assert V1RestorePoint.objects.using(JOURNAL_DB).filter(attempt_key=world.key).count() == 1
    assert V1RestorePoint._meta.db_table not in connections["default"].introspection.table_names()
    sha, size = pg_snapshot.file_sha256(point.dump_path)
    assert (sha, size) == (bytes(point.dump_sha256), point.dump_bytes) and size > 0
    live = pg_snapshot.digests_of()
    assert (live.schema, live.content) == (bytes(point.schema_digest), bytes(point.content_digest))
    certificate = V1ShutdownCertificate.objects.get(attempt=world.attempt)
    assert bytes(point.shutdown_certificate_digest) == bytes(certificate.digest)
    release = v1_owner().release()
    assert point.v1_release_id == RELEASE_ID == release.release_id
    assert bytes(point.v1_binary_digest) == release.binary_digest
    assert bytes(point.v1_schema_digest) == release.schema_digest
    # idempotent: the same receipt, not a second dump
    assert restore_point_capture(attempt_key=world.key, actor="op").pk == point.pk
    assert len(os.listdir(os.path.dirname(point.dump_path))) == 1


@TX
def test_restore_point_and_rehearsal_are_immutable_in_postgresql():
    """Proves: CV2-12-093 (the restore point receipt never changes; enforced by the journal database)."""
    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic(using=JOURNAL_DB):
        V1RestorePoint.objects.using(JOURNAL_DB).filter(pk=point.pk).update(dump_bytes=point.dump_bytes + 1)
    with dbroles.as_admin(JOURNAL_DB):  # beyond the application role's privileges, the journal's triggers
        with pytest.raises(IntegrityError, match="immutable|append"), transaction.atomic(using=JOURNAL_DB):
            V1RestorePoint.objects.using(JOURNAL_DB).filter(pk=point.pk).update(dump_bytes=point.dump_bytes + 1)
        with pytest.raises(IntegrityError), transaction.atomic(using=JOURNAL_DB):
            V1RestorePoint.objects.using(JOURNAL_DB).filter(pk=point.pk).delete()
    rehearsal = restore_point_rehearse(attempt_key=world.key, actor="op")
    with dbroles.as_admin(JOURNAL_DB), pytest.raises(IntegrityError), transaction.atomic(using=JOURNAL_DB):
        RestorePointRehearsal.objects.using(JOURNAL_DB).filter(pk=rehearsal.pk).update(scratch_database="x")


@TX
def test_pre_drain_snapshot_is_refused():
    """Proves: CV2-12-050 (a snapshot before every frozen gate is v1_drained is refused; nothing recorded)."""
    world = build_owners("pre-")
    seed_v1(world)
    drain(world, actions=("halt_v1", "stop_v1"))
    open_attempt(world)
    with pytest.raises(RestorePointRefused, match="v1_drained"):
        restore_point_capture(attempt_key=world.key, actor="op")
    assert not V1RestorePoint.objects.using(JOURNAL_DB).exists()


@TX
def test_missing_shutdown_certificate_is_refused():
    """Proves: CV2-12-050 (no restore point without the attempt's V1ShutdownCertificate)."""
    world = build_owners("nocert-")
    seed_v1(world)
    drain(world)
    open_attempt(world, certificate=False)
    with pytest.raises(RestorePointRefused, match="V1ShutdownCertificate"):
        restore_point_capture(attempt_key=world.key, actor="op")
    assert not V1RestorePoint.objects.using(JOURNAL_DB).exists()


def write_v2_lane(world) -> None:
    """One V2 row for an account of the attempt (an OrderingLane, as a V2 bug or early writer would leave it)."""
    OrderingLane.objects.create(epoch=world.epoch, account=world.accounts[0], route="records.webhook",
                                route_version=1, partition="p0", contract=OrderingContract.STRICT_SOURCE_SEQUENCE)


@TX
def test_any_v2_mutation_refuses_the_restore_point():
    """Proves: CV2-12-051 and decision 2 (one V2 execution row for the attempt's accounts refuses capture)."""
    world = drained_world()
    write_v2_lane(world)
    with pytest.raises(RestorePointRefused, match="OrderingLane"):
        restore_point_capture(attempt_key=world.key, actor="op")
    assert not V1RestorePoint.objects.using(JOURNAL_DB).exists()


@TX
def test_active_candidate_epoch_refuses_the_restore_point():
    """Proves: CV2-12-051 (the candidate epoch must not be active)."""
    world = drained_world()
    with connections["default"].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute('ALTER TABLE "connector_servingepoch" DISABLE TRIGGER ALL')
        cursor.execute('UPDATE "connector_servingepoch" SET state = %s WHERE id = %s', ["active", world.epoch.pk])
        cursor.execute('ALTER TABLE "connector_servingepoch" ENABLE TRIGGER ALL')
        dbroles.admin_off(cursor)
    with pytest.raises(RestorePointRefused, match="active"):
        restore_point_capture(attempt_key=world.key, actor="op")


@TX
def test_rehearsal_restores_into_a_scratch_database_boots_v1_and_drops_it():
    """Proves: CV2-12-052 (restored copy's digests equal, the exact V1 release boots against it, scratch dropped)."""
    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    rehearsal = restore_point_rehearse(attempt_key=world.key, actor="op")
    assert bytes(rehearsal.content_digest) == bytes(point.content_digest)
    assert bytes(rehearsal.schema_digest) == bytes(point.schema_digest)
    assert rehearsal.scratch_database.startswith(point.database_name + "_rehearse_")
    assert scratch_databases() == []


@TX
def test_an_administrators_extension_in_the_database_does_not_stop_the_rehearsal():
    """An extension the server administrator installed (pgrowlocks, as the benches do) is in the dump, but the owner
    role that restores may not create it: the rehearsal leaves such extensions out (the product's own btree_gist
    stays) and its digests still equal the restore point's (decision D-185). Proves: CV2-12-052"""
    world = drained_world()
    with dbroles.as_admin(), connections["default"].cursor() as cursor:
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
    try:
        point = restore_point_capture(attempt_key=world.key, actor="op")
        rehearsal = restore_point_rehearse(attempt_key=world.key, actor="op")
        assert bytes(rehearsal.content_digest) == bytes(point.content_digest)
        assert bytes(rehearsal.schema_digest) == bytes(point.schema_digest)
    finally:
        with dbroles.as_admin(), connections["default"].cursor() as cursor:
            cursor.execute("DROP EXTENSION IF EXISTS pgrowlocks")


@TX
def test_truncated_dump_is_rejected():
    """Proves: CV2-12-053 (a partial dump never rehearses)."""
    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    with open(point.dump_path, "r+b") as fh:
        fh.truncate(point.dump_bytes // 2)
    with pytest.raises(RestorePointInvalid, match="partial"):
        restore_point_rehearse(attempt_key=world.key, actor="op")
    assert not RestorePointRehearsal.objects.using(JOURNAL_DB).exists()


@TX
def test_altered_dump_with_same_size_fails_in_pg_restore_or_digests(monkeypatch):
    """Proves: CV2-12-053 (a dump whose bytes verify but whose content differs, e.g. a reset-only database, is
    caught by the recomputed digests in the scratch copy)."""
    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    from cutover.services import restore_point as rp
    monkeypatch.setattr(rp, "_verify_dump", lambda p: None)
    # a reset-only database: the same schema, no rows (pg_dump --schema-only of the live database)
    os.remove(point.dump_path)
    import subprocess
    subprocess.run([pg_snapshot.binary("pg_dump"), "-Fc", "--schema-only", "-f", point.dump_path,
                    *pg_snapshot._cli_args(point.database_name)], check=True, env=pg_snapshot._env())
    with pytest.raises(RestorePointInvalid, match="empty|digest"):
        restore_point_rehearse(attempt_key=world.key, actor="op")
    assert scratch_databases() == []


@TX
def test_live_drift_after_capture_rejects_the_rehearsal():
    """Proves: CV2-12-053 (the live database changed after capture: no rehearsal, no validation)."""
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    assert v1_cursors()  # the real V1's checkpointed cursors are part of the snapshot
    V1SourceCursor.objects.filter(source_key=f"{world.accounts[0].account_key}/webhook").update(cursor="moved")
    with pytest.raises(RestorePointInvalid, match="drifted"):
        restore_point_rehearse(attempt_key=world.key, actor="op")


@TX
def test_missing_pg_dump_names_what_to_install(monkeypatch):
    """Proves: CV2-12-050 (the snapshot tool's absence is a clear refusal, not a partial restore point)."""
    world = drained_world()
    monkeypatch.setenv("PG_BINDIR", "/nonexistent")
    with pytest.raises(RestorePointRefused, match="pg_dump is not installed.*postgresql-client"):
        restore_point_capture(attempt_key=world.key, actor="op")


@TX
def test_rehearsal_refuses_a_v1_release_other_than_the_frozen_tuple(monkeypatch):
    """Proves: CV2-12-052 (the rehearsal boots only the exact V1 release frozen in the restore point)."""
    import dataclasses
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    owner = v1_owner()
    frozen = owner.release()
    monkeypatch.setattr(type(owner), "release",
                        lambda self: dataclasses.replace(frozen, binary_digest=b"\x09" * 32))
    with pytest.raises(RestorePointInvalid, match="frozen release tuple"):
        restore_point_rehearse(attempt_key=world.key, actor="op")
    assert scratch_databases() == []


@TX
def test_the_real_v1_boot_check_failing_on_the_copy_refuses_the_rehearsal(monkeypatch):
    """Proves: CV2-12-052 (a copy the exact release does not boot against is refused: the real `v1_boot_check`
    runs in a separate process against the scratch database, here told to expect another schema)."""
    import dataclasses
    world = drained_world()
    restore_point_capture(attempt_key=world.key, actor="op")
    owner = v1_owner()
    real_boot = type(owner).boot_check
    monkeypatch.setattr(type(owner), "boot_check", lambda self, url, release, key: real_boot(
        self, url, dataclasses.replace(release, schema_digest=b"\x01" * 32), key))
    with pytest.raises(V1BootCheckFailed, match="schema digest"):
        restore_point_rehearse(attempt_key=world.key, actor="op")
    assert not RestorePointRehearsal.objects.using(JOURNAL_DB).exists()
    assert scratch_databases() == []


@TX
def test_a_write_committed_during_capture_is_in_neither_the_dump_nor_the_digests(monkeypatch):
    """Proves: CV2-12-051 (the digests, the refusal checks and the dump come from ONE snapshot: a write another
    connection commits after the snapshot was exported is in none of them, and shows as live drift)."""
    import threading
    from cutover.services import restore_point as rp
    from v1.models import V1HighWater
    world = drained_world()
    original = rp._snapshot_facts

    def facts_then_concurrent_write(attempt, account_ids, certificate):
        check = original(attempt, account_ids, certificate)

        def wrapped(cursor, snapshot_id):
            facts = check(cursor, snapshot_id)
            writer = threading.Thread(target=lambda: (V1HighWater.objects.update(high_water=777),
                                                      connections.close_all()))
            writer.start()
            writer.join()
            return facts
        return wrapped

    monkeypatch.setattr(rp, "_snapshot_facts", facts_then_concurrent_write)
    point = restore_point_capture(attempt_key=world.key, actor="op")
    assert set(V1HighWater.objects.values_list("high_water", flat=True)) == {777}  # committed meanwhile
    scratch = point.database_name + "_hc_consistency"
    pg_snapshot.create_scratch(scratch)
    try:
        pg_snapshot.restore_into(point.dump_path, scratch)
        copy = pg_snapshot.digests_of(scratch)
    finally:
        pg_snapshot.drop_database(scratch)
    assert (copy.schema, copy.content) == (bytes(point.schema_digest), bytes(point.content_digest))
    assert pg_snapshot.digests_of().content != bytes(point.content_digest)
    with pytest.raises(RestorePointInvalid, match="drifted"):
        restore_point_rehearse(attempt_key=world.key, actor="op")


@TX
def test_one_restore_point_per_attempt_binding_the_certified_drain():
    """The attempt has exactly one V1RestorePoint: a second capture returns it, and PostgreSQL refuses another row
    for the same attempt (even with other bytes). The row binds the post-drain snapshot (schema and content
    digests), the V1ShutdownCertificate (which itself binds the barrier receipts), the V1 release and
    configuration tuple, the owner cursors, the account/gate set and the reconciled-effect evidence, all inside
    its payload's digest. Proves: CV2-15-012"""
    import hashlib

    from cutover.models.restore import RESTORE_POINT_DIGESTS

    world = drained_world()
    point = restore_point_capture(attempt_key=world.key, actor="op")
    assert restore_point_capture(attempt_key=world.key, actor="op").pk == point.pk
    certificate = V1ShutdownCertificate.objects.get(attempt=world.attempt)
    assert bytes(point.shutdown_certificate_digest) == bytes(certificate.digest)
    assert len(bytes(certificate.barrier_receipts_digest)) == 32
    for name in ("schema_digest", "content_digest", "cursors_digest", "account_gate_digest",
                 "effect_evidence_digest", "v1_configuration_digest", "configuration_digest"):
        assert name in RESTORE_POINT_DIGESTS and len(bytes(getattr(point, name))) == 32, name
        assert bytes(getattr(point, name)) in bytes(point.payload), name
    assert hashlib.sha256(bytes(point.payload)).digest() == bytes(point.digest)
    row = {f.attname: getattr(point, f.attname) for f in V1RestorePoint._meta.concrete_fields if f.attname != "id"}
    with pytest.raises(IntegrityError, match="attempt_key"), transaction.atomic(using=JOURNAL_DB):
        V1RestorePoint.objects.using(JOURNAL_DB).create(**{**row, "digest": b"\x01" * 32, "payload": b"other"})
    assert V1RestorePoint.objects.using(JOURNAL_DB).filter(attempt_key=world.key).count() == 1
