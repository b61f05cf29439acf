"""A small in-test implementation of the V1 owner port (cutover.ports) for the restore tests, used until the real
`v1` app (engineer A, branch v1-app) is merged. Its V1 state lives in one table of the `default` database
(`restore_double_v1`: cursors, high-waters, terminal effect evidence, generations, barriers), so a pg_dump /
pg_restore of `default` captures and restores it exactly as it would the real V1 tables (decision 2).

Install with `install_double(settings)` (override CUTOVER_V1_OWNER and clear the port cache)."""
from __future__ import annotations

import hashlib

import psycopg
from django.db import connection

from cutover.errors import RestorePointInvalid
from cutover.ports import (
    HighWater, Inventory, InventoryItem, Receipt, V1Generation, V1Release, v1_owner,
)

TABLE = "restore_double_v1"
RELEASE = V1Release(release_id="v1-2026.11.3", binary_digest=hashlib.sha256(b"v1 binary").digest(),
                    schema_digest=hashlib.sha256(b"v1 schema").digest(),
                    configuration_digest=hashlib.sha256(b"v1 config").digest())
DOTTED = "tests.cutover.restore_v1_double.RestoreV1Double"


def create_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, kind text NOT NULL, "
                       "account_key text NOT NULL DEFAULT '', key text NOT NULL, value text NOT NULL)")


def put(kind: str, key: str, value: str, account_key: str = "") -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (kind, account_key, key, value) VALUES (%s, %s, %s, %s)",
                       [kind, account_key, key, value])


def rows(kind: str) -> list[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT account_key, key, value FROM {TABLE} WHERE kind = %s ORDER BY id", [kind])
        return [tuple(r) for r in cursor.fetchall()]


def set_value(kind: str, key: str, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET value = %s WHERE kind = %s AND key = %s", [value, kind, key])


def install_double(settings) -> None:
    settings.CUTOVER_V1_OWNER = DOTTED
    v1_owner.cache_clear()


def _receipt(kind: str, attempt_key: str, subject: str) -> Receipt:
    payload = f"{kind}|{attempt_key}|{subject}".encode()
    return Receipt(kind=kind, attempt_key=attempt_key, subject=subject, payload=payload,
                   digest=hashlib.sha256(payload).digest())


class RestoreV1Double:
    def release(self) -> V1Release:
        return RELEASE

    def current_generation(self) -> V1Generation | None:
        generations = rows("generation")
        if not generations:
            return None
        _, generation_id, state = generations[-1]
        return V1Generation(generation_id, RELEASE.release_id, state, state == "terminated")

    def inventory(self, account_keys: list[str]) -> Inventory:
        blocking = tuple(InventoryItem("effect_unproven", TABLE, key, a, value)
                         for a, key, value in rows("blocking") if a in account_keys)
        cursors = tuple((key, value) for a, key, value in rows("cursor") if a in account_keys)
        evidence = [f"{a}|{k}|{v}" for a, k, v in rows("effect") if a in account_keys]
        digest = hashlib.sha256("\n".join([*evidence, *(f"{k}={v}" for k, v in cursors)]).encode()).digest()
        return Inventory(blocking, cursors, digest)

    def high_waters(self, account_keys: list[str]) -> list[HighWater]:
        return [HighWater(a, key, b"p0", value.encode(), "integer") for a, key, value in rows("high_water")
                if a in account_keys]

    def start_generation(self, release_id: str, attempt_key: str) -> V1Generation:
        assert release_id == RELEASE.release_id, f"asked to start {release_id}"
        generation_id = f"gen-{len(rows('generation')) + 1}"
        put("generation", generation_id, "running")
        return V1Generation(generation_id, release_id, "running", False)

    def reopen_barrier(self, kind, attempt_key: str) -> Receipt:
        put("barrier", kind.value, "open")
        return _receipt("barrier.reopened", attempt_key, kind.value)

    def close_barrier(self, kind, attempt_key: str) -> Receipt:
        put("barrier", kind.value, "closed")
        return _receipt("barrier.closed", attempt_key, kind.value)

    def boot_check(self, database_url: str, release: V1Release, attempt_key: str) -> Receipt:
        """Boots (connects as) V1 against the copy: its table must be there with cursors and a generation."""
        if release != RELEASE:
            raise RestorePointInvalid("boot_check: not the exact V1 release")
        try:
            with psycopg.connect(database_url) as conn:
                found = conn.execute(f"SELECT kind, count(*) FROM {TABLE} GROUP BY kind").fetchall()
        except psycopg.Error as exc:
            raise RestorePointInvalid(f"V1 does not boot against the copy: {exc}") from exc
        kinds = dict(found)
        if not kinds.get("cursor") or not kinds.get("generation"):
            raise RestorePointInvalid(f"V1 boot found no cursors or generations: {kinds}")
        return _receipt("restore.boot_checked", attempt_key, database_url.rsplit("/", 1)[-1])
