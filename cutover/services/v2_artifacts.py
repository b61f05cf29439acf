"""The V2 artifacts a service cutover freezes at preflight and verifies offline before maintenance (seed "Offline V1
shutdown", CV2-12-019): the V2 schema digest and the V2 binary digest, with V2 admission, replay, claims, Runtime
submission and provider I/O disabled.

- `schema_digest(cursor)`: the applied migrations of the V2 apps plus PostgreSQL's own description (pg_catalog /
  information_schema) of every V2 table's columns, constraints, indexes and triggers. The same digest is computed
  on a restored copy (the preflight rehearsal), so definitions are compared as pg_snapshot normalizes them.
- `binary_digest()`: sha256 over every file of the product's V2 code (the four apps, observability, config and the
  templates), by relative path in byte order, `__pycache__` excluded: the exact code the V2 processes would run.
- `offline_verify(attempt, certificate)`: both recomputed and byte-compared with the certificate, the candidate
  epoch still `verified` with its frozen digest, the configuration still the certificate's, and V2 provably
  stopped (no active epoch, no V2 receipt for the attempt's accounts, no gate outside the V1 modes). Any
  mismatch refuses with V2_ARTIFACT_MISMATCH and changes nothing.

Conformance proofs are frozen in the certificate by their own owner (route dispositions); this module verifies
only the schema and the binary.
"""
from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.db import connection

from connector.choices import EpochState, GateMode
from connector.selectors.rows import AccountServingGate, Receipt, ServingEpoch
from cutover.errors import OrderingPlanDrifted, V2ArtifactMismatch
from cutover.services import ordering_plan
from cutover.services.pg_snapshot import normalized_value

V2_APPS = ("connector", "effects", "cutover", "governance", "observability")
CODE_DIRS = ("connector", "effects", "cutover", "governance", "observability", "config", "templates")
# Gate modes in which no V2 path of an account can admit, replay, claim, submit or dispatch (V2 disabled).
V2_DISABLED_MODES = frozenset({GateMode.V1_SERVING, GateMode.HALTING_V1})

SCHEMA_SQL = [
    ("migrations", "SELECT app, name FROM django_migrations WHERE app = ANY(%(apps)s) ORDER BY 1, 2"),
    ("tables", "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
               "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname = ANY(%(tables)s) "
               "ORDER BY 1"),
    ("columns", "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '') "
                "FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = ANY(%(tables)s) ORDER BY 1, 2"),
    ("constraints", "SELECT r.relname, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c "
                    "JOIN pg_class r ON r.oid = c.conrelid JOIN pg_namespace n ON n.oid = r.relnamespace "
                    "WHERE n.nspname = current_schema() AND r.relname = ANY(%(tables)s) ORDER BY 1, 2"),
    ("indexes", "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
                "AND tablename = ANY(%(tables)s) ORDER BY 1, 2"),
    ("triggers", "SELECT r.relname, t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t "
                 "JOIN pg_class r ON r.oid = t.tgrelid JOIN pg_namespace n ON n.oid = r.relnamespace "
                 "WHERE n.nspname = current_schema() AND NOT t.tgisinternal AND r.relname = ANY(%(tables)s) "
                 "ORDER BY 1, 2"),
]


def v2_tables() -> list[str]:
    """Every table of the V2 apps' models (auto-created many-to-many tables included), sorted."""
    return sorted({m._meta.db_table for label in V2_APPS
                   for m in apps.get_app_config(label).get_models(include_auto_created=True)})


def schema_digest(cursor=None) -> bytes:
    """The V2 schema digest of the database `cursor` reads (default: Django's `default` connection)."""
    if cursor is None:
        with connection.cursor() as own:
            return schema_digest(own)
    h = hashlib.sha256(b"nexuscrm.v2.schema.v1")
    params = {"apps": list(V2_APPS), "tables": v2_tables()}
    for label, sql in SCHEMA_SQL:
        cursor.execute(sql, params)
        for row in cursor.fetchall():
            h.update(repr((label, *map(normalized_value, row))).encode() + b"\n")
    return h.digest()


def code_dirs() -> list[Path]:
    return [Path(settings.BASE_DIR) / name for name in CODE_DIRS]


def binary_digest() -> bytes:
    """sha256 of the V2 code: every file under CODE_DIRS, named `<dir>/<relative path>`, in byte order of the names,
    `__pycache__` excluded; each name and content length-prefixed."""
    files = sorted((f"{root.name}/{path.relative_to(root)}".encode(), path) for root in code_dirs()
                   for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts)
    h = hashlib.sha256(b"nexuscrm.v2.binary.v1")
    for name, path in files:
        data = path.read_bytes()
        h.update(len(name).to_bytes(4, "big") + name + len(data).to_bytes(8, "big") + data)
    return h.digest()


def offline_problems(attempt, certificate) -> list[str]:
    """Why the V2 schema, binary, candidate epoch, configuration and route conformance proofs (the recomputed
    ordering plan) are not exactly the certificate's, or why V2 is not provably disabled for the attempt's accounts
    (empty = verified)."""
    problems = []
    if not hmac.compare_digest(schema_digest(), bytes(certificate.v2_schema_digest)):
        problems.append("the V2 schema differs from the certificate's (v2_schema_digest)")
    if not hmac.compare_digest(binary_digest(), bytes(certificate.v2_binary_digest)):
        problems.append("the V2 binary differs from the certificate's (v2_binary_digest)")
    epoch = ServingEpoch.objects.filter(pk=attempt.candidate_epoch_id).values_list("state", "digest").first()
    if epoch is None or epoch[0] != EpochState.VERIFIED or not hmac.compare_digest(
            bytes(epoch[1]), bytes(certificate.epoch_digest)):
        problems.append("the candidate ServingEpoch is not verified with the certificate's digest")
    if attempt.configuration.generation_id != certificate.configuration_generation_id:
        problems.append("the configuration generation is not the certificate's")
    try:  # the conformance proofs and source-order facts of every route, as certified (D-311, D-312)
        ordering_plan.plan_revalidate(attempt, certificate)
    except OrderingPlanDrifted as exc:
        problems.append(f"the route conformance proofs differ from the certificate's: {exc.detail}")
    if ServingEpoch.objects.filter(state=EpochState.ACTIVE).exists():
        problems.append("a ServingEpoch is active: V2 is not disabled")
    ids = list(attempt.configuration.accounts.values_list("account_id", flat=True))
    if Receipt.objects.filter(account_id__in=ids).exists():
        problems.append("a V2 receipt exists for the attempt's accounts: V2 is not disabled")
    enabled = AccountServingGate.objects.filter(account_id__in=ids).exclude(mode__in=V2_DISABLED_MODES)
    if enabled.exists():
        problems.append("a gate of the attempt's accounts is outside v1_serving/halting_v1: V2 is not disabled")
    return problems


def offline_verify(attempt, certificate) -> None:
    problems = offline_problems(attempt, certificate)
    if problems:
        raise V2ArtifactMismatch("offline verification before maintenance failed: " + "; ".join(problems),
                                 reasons=problems)
