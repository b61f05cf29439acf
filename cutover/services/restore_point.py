"""Seed step 6: capture the V1RestorePoint (CV2-12-050/051/093) and rehearse it in isolation (CV2-12-052/053).

Capture happens only at `v1_drained` before any V2 mutation: inside ONE exported REPEATABLE READ snapshot of
`default` it re-reads the frozen gates, the V1ShutdownCertificate, the V2 execution tables and the epochs, computes
the schema and content digests, and `pg_dump`s that very snapshot; so the facts checked are the facts dumped. The
receipt goes to the journal database, which a restore of `default` does not touch.

The rehearsal restores the dump into a scratch database, recomputes the digests there, boots the exact V1 release
against it through the owner port (`boot_check`), drops the scratch database and records an immutable receipt.
"""
from __future__ import annotations

import hashlib
import os
import uuid

from django.conf import settings
from django.db import IntegrityError, transaction

from config.routers import JOURNAL_DB
from connector.choices import GateMode
from cutover.errors import RestorePointInvalid, RestorePointRefused
from cutover.models import RestorePointRehearsal, ServiceCutoverAttempt, V1RestorePoint, V1ShutdownCertificate
from cutover.ports import v1_owner
from cutover.services import pg_snapshot
from cutover.services.v2_scope import active_epochs, attempt_account_ids, gate_rows, v2_rows

__all__ = ["restore_point_capture", "restore_point_rehearse", "restore_point_for", "live_drift", "recompute_digests",
           "rehearsed_restore_point", "frame", "attempt_for"]


def frame(*parts: bytes | str | int) -> bytes:
    """Canonical length-delimited framing of the parts (typed: b/s/i), the payload of every receipt here."""
    out = bytearray(b"cutover.restore.v1")
    for part in parts:
        if isinstance(part, int):
            tag, data = b"i", str(part).encode()
        elif isinstance(part, str):
            tag, data = b"s", part.encode()
        else:
            tag, data = b"b", bytes(part)
        out += tag + len(data).to_bytes(8, "big") + data
    return bytes(out)


def _sha(*parts) -> bytes:
    return hashlib.sha256(frame(*parts)).digest()


def attempt_for(attempt_key: str) -> ServiceCutoverAttempt:
    attempt = ServiceCutoverAttempt.objects.select_related("configuration", "candidate_epoch").filter(
        attempt_key=attempt_key).first()
    if attempt is None:
        raise RestorePointRefused(f"no service cutover attempt {attempt_key}")
    return attempt


def restore_point_for(attempt_key: str) -> V1RestorePoint | None:
    return V1RestorePoint.objects.using(JOURNAL_DB).filter(attempt_key=attempt_key).first()


def _dump_path(attempt_key: str) -> str:
    root = settings.CUTOVER_RESTORE_POINT_DIR
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in attempt_key)
    return os.path.join(str(root), safe, f"default-{uuid.uuid4().hex}.dump")


def _snapshot_facts(attempt: ServiceCutoverAttempt, account_ids: list[int], certificate):
    """Runs inside the exported snapshot: the refusal rules and every frozen fact, read at the snapshot dumped (the
    owner port through Django's connection importing the same snapshot)."""
    def check(cursor, snapshot_id: str) -> dict:
        gates = gate_rows(cursor, account_ids)
        if len(gates) != len(account_ids) or not account_ids:
            raise RestorePointRefused(f"attempt {attempt.attempt_key}: {len(account_ids)} frozen accounts but "
                                      f"{len(gates)} gates")
        undrained = [f"account {a}: {m}" for a, m, _ in gates if m != GateMode.V1_DRAINED]
        if undrained:
            raise RestorePointRefused("a restore point is taken at v1_drained only (pre-drain snapshot refused): "
                                      + "; ".join(undrained))
        cursor.execute(f'SELECT digest FROM "{V1ShutdownCertificate._meta.db_table}" WHERE attempt_id = %s',
                       [attempt.pk])
        row = cursor.fetchone()
        if row is None:
            raise RestorePointRefused(f"attempt {attempt.attempt_key} has no V1ShutdownCertificate")
        touched = v2_rows(cursor, account_ids)
        if touched:
            raise RestorePointRefused("V2 already mutated the attempt's scope (decision 2): " + "; ".join(touched))
        active = active_epochs(cursor)
        if active:
            raise RestorePointRefused("a ServingEpoch already became active: " + ", ".join(active))
        cursor.execute(f'SELECT outcome FROM "{ServiceCutoverAttempt._meta.db_table}" WHERE id = %s', [attempt.pk])
        if cursor.fetchone()[0] != "open":
            raise RestorePointRefused(f"attempt {attempt.attempt_key} is closed")
        cursor.execute('SELECT a.id, a.account_key FROM "connector_connectoraccount" a WHERE a.id = ANY(%s) '
                       "ORDER BY a.id", [account_ids])
        keys = dict(cursor.fetchall())
        cursor.execute('SELECT t::text FROM "connector_v1acceptancetombstone" t WHERE account_id = ANY(%s) '
                       "ORDER BY 1", [account_ids])
        tombstones = [r[0] for r in cursor.fetchall()]
        cursor.execute('SELECT t::text FROM "connector_receiptadmissionkey" t WHERE account_id = ANY(%s) '
                       "ORDER BY 1", [account_ids])
        admission = [r[0] for r in cursor.fetchall()]
        with pg_snapshot.django_in_snapshot(snapshot_id):
            port = _port_digests(attempt, [keys[a] for a in account_ids], certificate)
        return {"gates": gates, "certificate_digest": bytes(row[0]), "keys": keys, "port": port,
                "identity": _sha("identity", *tombstones, "admission", *admission)}
    return check


def _port_digests(attempt: ServiceCutoverAttempt, account_keys: list[str], certificate) -> dict:
    """The owner-port facts of the drained V1: release tuple, cursors, high-waters and terminal-effect evidence."""
    port = v1_owner()
    release = port.release()
    if release.release_id != attempt.v1_release_id or release.release_id != certificate.v1_release_id:
        raise RestorePointRefused(f"the V1 release {release.release_id} is not the attempt's certified release "
                                  f"{attempt.v1_release_id}")
    inventory = port.inventory(account_keys)  # in the caller's (snapshot) transaction
    high_waters = port.high_waters(account_keys)
    if inventory.blocking:
        raise RestorePointRefused(f"V1 is not drained: {len(inventory.blocking)} blocking inventory items")
    cursors = _sha("cursors", *(f"{s}={c}" for s, c in sorted(inventory.cursors)))
    ordering = _sha("ordering", bytes(certificate.baseline_coverage_digest),
                    *(frame(h.account_key, h.route_key, h.partition_key, h.high_water, h.comparator)
                      for h in sorted(high_waters, key=lambda h: (h.account_key, h.route_key, h.partition_key))))
    return {"release": release, "cursors": cursors, "ordering": ordering,
            "effects": _sha("effects", bytes(inventory.digest), bytes(certificate.inventory_digest))}


def restore_point_capture(*, attempt_key: str, actor: str) -> V1RestorePoint:
    """Capture the attempt's restore point (idempotent: an existing one is returned unchanged)."""
    existing = restore_point_for(attempt_key)
    if existing is not None:
        return existing
    attempt = attempt_for(attempt_key)
    certificate = V1ShutdownCertificate.objects.filter(attempt=attempt).first()
    if certificate is None:
        raise RestorePointRefused(f"attempt {attempt_key} has no V1ShutdownCertificate")
    account_ids = attempt_account_ids(attempt)
    path = _dump_path(attempt_key)
    digests, facts = pg_snapshot.snapshot_and_dump(path, _snapshot_facts(attempt, account_ids, certificate))
    if digests.rows == 0:
        raise RestorePointRefused("the database is empty: nothing to restore to")
    port = facts["port"]
    dump_sha, dump_bytes = pg_snapshot.file_sha256(path)
    release = port["release"]
    values = {
        "attempt_key": attempt_key, "database_name": pg_snapshot.connection_params()["dbname"],
        "v1_release_id": release.release_id, "v1_binary_digest": release.binary_digest,
        "v1_schema_digest": release.schema_digest, "v1_configuration_digest": release.configuration_digest,
        "configuration_digest": bytes(certificate.configuration_digest),
        "schema_digest": digests.schema, "content_digest": digests.content, "cursors_digest": port["cursors"],
        "account_gate_digest": _sha("gates", *(frame(a, facts["keys"][a], m, f) for a, m, f in facts["gates"])),
        "shutdown_certificate_digest": facts["certificate_digest"],
        "identity_coverage_digest": facts["identity"], "ordering_coverage_digest": port["ordering"],
        "effect_evidence_digest": port["effects"], "dump_path": path, "dump_sha256": dump_sha,
        "dump_bytes": dump_bytes,
    }
    payload = frame(*(values[k] for k in sorted(values)))
    try:
        with transaction.atomic(using=JOURNAL_DB):
            return V1RestorePoint.objects.using(JOURNAL_DB).create(
                **values, payload=payload, digest=hashlib.sha256(payload).digest(), captured_by=actor)
    except IntegrityError:
        winner = restore_point_for(attempt_key)
        if winner is None:
            raise
        os.remove(path)
        return winner


def _verify_dump(point: V1RestorePoint) -> None:
    if not os.path.exists(point.dump_path):
        raise RestorePointInvalid(f"the restore point dump {point.dump_path} is missing")
    sha, size = pg_snapshot.file_sha256(point.dump_path)
    if size != point.dump_bytes or sha != bytes(point.dump_sha256):
        raise RestorePointInvalid(f"the restore point dump is partial or altered ({size} bytes, expected "
                                  f"{point.dump_bytes}; sha256 {'matches' if sha == bytes(point.dump_sha256) else 'differs'})")


def live_drift(point: V1RestorePoint) -> list[str]:
    """What differs between the live `default` database and the restore point (empty = no drift)."""
    live = pg_snapshot.digests_of()
    return [name for name, a, b in (("schema", live.schema, point.schema_digest),
                                    ("content", live.content, point.content_digest)) if a != bytes(b)]


def recompute_digests(point: V1RestorePoint) -> dict[str, tuple[bytes, bytes]]:
    """Every frozen digest recomputed from the live `default` database and the owner port, as
    name -> (now, frozen). Used to verify a restored database (CV2-12-074)."""
    attempt = attempt_for(point.attempt_key)
    certificate = V1ShutdownCertificate.objects.filter(attempt=attempt).first()
    if certificate is None:
        raise RestorePointInvalid(f"the restored database has no V1ShutdownCertificate for {point.attempt_key}")
    account_ids = attempt_account_ids(attempt)
    with pg_snapshot.exported_snapshot() as (snapshot_id, cursor):
        facts = _snapshot_facts(attempt, account_ids, certificate)(cursor, snapshot_id)
        digests = pg_snapshot.digest_cursor(cursor)
    port = facts["port"]
    gates = _sha("gates", *(frame(a, facts["keys"][a], m, f) for a, m, f in facts["gates"]))
    now = {"schema": digests.schema, "content": digests.content, "cursors": port["cursors"],
           "account_gate": gates, "shutdown_certificate": facts["certificate_digest"],
           "identity_coverage": facts["identity"], "ordering_coverage": port["ordering"],
           "effect_evidence": port["effects"]}
    return {name: (value, bytes(getattr(point, f"{name}_digest"))) for name, value in now.items()}


def restore_point_rehearse(*, attempt_key: str, actor: str) -> RestorePointRehearsal:
    """Restore the dump into a scratch database, verify its digests, boot the exact V1 release there, drop it."""
    point = restore_point_for(attempt_key)
    if point is None:
        raise RestorePointInvalid(f"attempt {attempt_key} has no restore point")
    _verify_dump(point)
    drift = live_drift(point)
    if drift:
        raise RestorePointInvalid(f"the live database drifted since the restore point ({', '.join(drift)})")
    scratch = f"{point.database_name}_rehearse_{uuid.uuid4().hex[:8]}"[:63]
    pg_snapshot.create_scratch(scratch)
    try:
        pg_snapshot.restore_into(point.dump_path, scratch)
        restored = pg_snapshot.digests_of(scratch)
        if restored.rows == 0:
            raise RestorePointInvalid("the rehearsal restored an empty database")
        if restored.schema != bytes(point.schema_digest) or restored.content != bytes(point.content_digest):
            raise RestorePointInvalid("the rehearsal's schema or content digest differs from the restore point")
        port = v1_owner()
        release = port.release()
        if (release.release_id, release.binary_digest, release.schema_digest, release.configuration_digest) != (
                point.v1_release_id, bytes(point.v1_binary_digest), bytes(point.v1_schema_digest),
                bytes(point.v1_configuration_digest)):
            raise RestorePointInvalid("the V1 release offered for the rehearsal is not the frozen release tuple")
        params = pg_snapshot.connection_params(scratch)
        url = f"postgres://{params['user']}@{params['host']}:{params['port']}/{scratch}"
        boot = port.boot_check(url, release, attempt_key)
        if boot.attempt_key != attempt_key:
            raise RestorePointInvalid("the boot receipt names another attempt")
    finally:
        pg_snapshot.drop_database(scratch)
    payload = frame(point.digest, scratch, restored.schema, restored.content, point.dump_sha256, boot.digest)
    with transaction.atomic(using=JOURNAL_DB):
        return RestorePointRehearsal.objects.using(JOURNAL_DB).create(
            restore_point=point, attempt_key=attempt_key, scratch_database=scratch, schema_digest=restored.schema,
            content_digest=restored.content, dump_sha256=bytes(point.dump_sha256), boot_receipt_digest=boot.digest,
            digest=hashlib.sha256(payload).digest(), rehearsed_by=actor)


def rehearsed_restore_point(attempt_key: str) -> V1RestorePoint:
    """The attempt's restore point, rehearsed, with an intact dump (no check of the live database here)."""
    point = restore_point_for(attempt_key)
    if point is None:
        raise RestorePointInvalid(f"attempt {attempt_key} has no restore point")
    if not point.rehearsals.using(JOURNAL_DB).exists():
        raise RestorePointInvalid(f"the restore point of {attempt_key} was never rehearsed")
    _verify_dump(point)
    return point
