"""`V1Owner`: this product's V1 deployment behind cutover.ports.V1OwnerPort. The coordinator calls it for
barriers, inventories, process-generation receipts, reconciliation and exports; every receipt is canonical bytes
(connector.canonical, domain `nexuscrm.v1.receipt.v1`) and their sha256."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Min
from django.utils import timezone

from connector.canonical.encoding import Record, encode
from cutover.ports import (
    BarrierKind,
    EgressManifest,
    HighWater,
    Inventory,
    InventoryItem,
    Receipt,
    RouteHaltContract,
    SourceOrderFacts,
    TransportIdentity,
    V1Generation,
    V1Release,
    Workload,
)
from v1 import manifest, runtime
from v1.errors import V1BootCheckFailed, V1GenerationRefused, V1ReconcileRefused
from v1.models import (
    RELEASE_ID,
    EFFECT_TERMINAL,
    EffectState,
    GenerationState,
    V1Barrier,
    V1HighWater,
    V1OutboundEffect,
    V1ProcessGeneration,
    V1SourceCursor,
    V1WorkItem,
    WorkState,
)

DOMAIN = "nexuscrm.v1.receipt.v1"
# The webhook's V1 high-water is the source's own record sequence (V1HighWater, advanced only by an applied item),
# compared as an integer, ties broken by the transport key, one partition per record, every partition enumerated
# by `high_waters`: the typed facts a `v1_high_water` disposition needs (CV2-06-019).
WEBHOOK_ORDER = SourceOrderFacts(position_source="source_position", position_kind="integer", comparator="integer",
                                 tie_breaker="transport_key", partition_key="record_id", exhaustive_partitions=True)
ROUTES = (RouteHaltContract(route_key="records.webhook", lossless_halt=True, ordering_disposition="v1_high_water",
                            disposition_proof_digest=WEBHOOK_ORDER.digest,
                            remediation_owner="records-integration-team", source_order=WEBHOOK_ORDER),)
V1_TABLE_PREFIX = "v1_"


def receipt(kind: str, attempt_key: str, subject: str, fields: list[tuple[str, object]]) -> Receipt:
    plain = [(name, str(value) if isinstance(value, str) else value) for name, value in fields]  # no enum subclasses
    payload = encode(DOMAIN, Record([("kind", kind), ("attempt", attempt_key), ("subject", subject), *plain]))
    return Receipt(kind=kind, attempt_key=attempt_key, subject=subject, payload=payload,
                   digest=hashlib.sha256(payload).digest())


def binary_digest() -> bytes:
    h = hashlib.sha256()
    for path in sorted(Path(manifest.PACKAGE_ROOT).rglob("*.py")):
        if "migrations" in path.parts or "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(manifest.PACKAGE_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.digest()


def schema_digest(cursor) -> bytes:
    """The V1 tables' columns and types, as PostgreSQL reports them."""
    cursor.execute("SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
                   "WHERE table_schema = 'public' AND table_name LIKE 'v1\\_%%' ORDER BY 1, 2")
    return hashlib.sha256(json.dumps(cursor.fetchall()).encode()).digest()


class V1Owner:
    def release(self) -> V1Release:
        with connection.cursor() as cursor:
            schema = schema_digest(cursor)
        configuration = hashlib.sha256(json.dumps([RELEASE_ID, [r.route_key for r in ROUTES]]).encode()).digest()
        return V1Release(RELEASE_ID, binary_digest(), schema, configuration)

    def current_generation(self) -> V1Generation | None:
        row = V1ProcessGeneration.objects.order_by("-pk").first()
        return None if row is None else V1Generation(row.generation_id, row.release_id, row.state,
                                                      row.egress_isolated)

    def egress_manifest(self) -> EgressManifest:
        return manifest.current()

    def route_contracts(self) -> list[RouteHaltContract]:
        return list(ROUTES)

    def measure(self, account_keys: list[str]) -> Workload:
        items = V1WorkItem.objects.filter(account_key__in=account_keys)
        open_items = items.exclude(state=WorkState.DONE)
        effects = V1OutboundEffect.objects.filter(account_key__in=account_keys)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_database_size(current_database())")
            size = cursor.fetchone()[0]
        # The dependency deadlines of the accepted work still open (one aggregate): V1 keeps each such item open
        # until its dependency resolves or the deadline passes, so the drain lasts at least until the latest.
        deadlines = open_items.filter(dependency_deadline__isnull=False).aggregate(
            nearest=Min("dependency_deadline"), latest=Max("dependency_deadline"))
        now = timezone.now()

        def seconds(at) -> float | None:
            return None if at is None else max(0.0, (at - now).total_seconds())

        return Workload(accepted_backlog=open_items.count(),
                        open_partitions=open_items.values("account_key", "partition").distinct().count(),
                        live_leases=items.filter(state=WorkState.CLAIMED).count(),
                        ambiguous_effects=effects.filter(state__in=(EffectState.DISPATCHING,
                                                                    EffectState.AMBIGUOUS)).count(),
                        nearest_dependency_deadline_s=seconds(deadlines["nearest"]),
                        latest_dependency_deadline_s=seconds(deadlines["latest"]), database_bytes=size)

    def _set_barrier(self, kind: BarrierKind, attempt_key: str, closed: bool) -> Receipt:
        runtime.barriers_install()
        with transaction.atomic():
            # FOR UPDATE waits for every entry transaction holding the barrier FOR SHARE (CV2-12-030).
            barrier = V1Barrier.objects.select_for_update().get(kind=kind.value)
            if barrier.closed != closed:
                barrier.closed, barrier.fence = closed, barrier.fence + 1
                barrier.attempt_key = attempt_key if closed else ""
                barrier.save()
            return receipt(f"barrier.{kind.value}.{'closed' if closed else 'open'}", attempt_key, kind.value,
                           [("fence", barrier.fence), ("closed", barrier.closed)])

    def close_barrier(self, kind: BarrierKind, attempt_key: str) -> Receipt:
        return self._set_barrier(kind, attempt_key, True)

    def reopen_barrier(self, kind: BarrierKind, attempt_key: str) -> Receipt:
        return self._set_barrier(kind, attempt_key, False)

    def inventory(self, account_keys: list[str]) -> Inventory:
        blocking: list[InventoryItem] = []
        for item in V1WorkItem.objects.filter(account_key__in=account_keys).exclude(state=WorkState.DONE) \
                .order_by("pk"):
            kind = "live_lease" if item.state == WorkState.CLAIMED else "inbound_nonterminal"
            open_effects = {str(e) for e in item.effects.exclude(state__in=EFFECT_TERMINAL)
                            .values_list("state", flat=True)}
            if kind == "live_lease" and open_effects == {EffectState.DISPATCHING}:
                kind = "io_may_have_started"  # its fate rests only on the provider call in flight
            blocking.append(InventoryItem(kind, "v1_v1workitem", str(item.pk), item.account_key,
                                          f"{item.transport_key} {item.state}"))
        for effect in V1OutboundEffect.objects.filter(account_key__in=account_keys) \
                .exclude(state__in=EFFECT_TERMINAL).order_by("pk"):
            kind = "io_may_have_started" if effect.state == EffectState.DISPATCHING else "effect_unproven"
            blocking.append(InventoryItem(kind, "v1_v1outboundeffect", str(effect.pk), effect.account_key,
                                          f"{effect.request_key} {effect.state}"))
        for cursor in V1SourceCursor.objects.filter(checkpointed=False).order_by("source_key"):
            blocking.append(InventoryItem("cursor_uncheckpointed", "v1_v1sourcecursor", str(cursor.pk), "",
                                          cursor.source_key))
        cursors = tuple(V1SourceCursor.objects.order_by("source_key").values_list("source_key", "cursor"))
        terminal = [[e.request_key, str(e.state), e.remote_id, hashlib.sha256(e.evidence.encode()).digest()]
                    for e in V1OutboundEffect.objects.filter(account_key__in=account_keys).order_by("request_key")]
        value = Record([("blocking", [[b.kind, b.table, b.row_id] for b in blocking]),
                        ("cursors", [list(c) for c in cursors]), ("effects", terminal),
                        ("items", [[i.transport_key, str(i.state)] for i in V1WorkItem.objects
                                   .filter(account_key__in=account_keys).order_by("pk")])])
        return Inventory(tuple(blocking), cursors, hashlib.sha256(encode(DOMAIN, value)).digest())

    def _generation(self, generation_id: str) -> V1ProcessGeneration:
        row = V1ProcessGeneration.objects.select_for_update().filter(generation_id=generation_id).first()
        if row is None:
            raise V1GenerationRefused(f"no V1 generation {generation_id}")
        return row

    def terminate_generation(self, generation_id: str, attempt_key: str) -> Receipt:
        with transaction.atomic():
            row = self._generation(generation_id)
            if row.state == GenerationState.RUNNING:
                row.terminate()
                row.terminated_at = timezone.now()
                row.save()
            return receipt("generation.terminated", attempt_key, generation_id,
                           [("release", row.release_id), ("state", row.state), ("restartable", False)])

    def isolate_egress(self, generation_id: str, attempt_key: str) -> Receipt:
        with transaction.atomic():
            row = self._generation(generation_id)
            if not row.egress_isolated:
                row.egress_isolated = True
                row.save()
            return receipt("egress.isolated", attempt_key, generation_id, [("egress_isolated", True)])

    def start_generation(self, release_id: str, attempt_key: str) -> V1Generation:
        if release_id != RELEASE_ID:
            raise V1GenerationRefused(f"release {release_id} is not the deployed V1 release {RELEASE_ID}")
        row = runtime.generation_start(started_by=f"cutover {attempt_key}", release_id=release_id)
        return V1Generation(row.generation_id, row.release_id, row.state, row.egress_isolated)

    def reconcile_effect(self, effect_row_id: str, outcome: str, evidence: bytes, attempt_key: str) -> Receipt:
        effect = V1OutboundEffect.objects.select_for_update().filter(pk=int(effect_row_id)).first()
        if effect is None or effect.state not in (EffectState.DISPATCHING, EffectState.AMBIGUOUS):
            raise V1ReconcileRefused(f"V1 effect {effect_row_id} is not awaiting reconciliation")
        note = f"reconciled by cutover {attempt_key}: sha256 {hashlib.sha256(evidence).hexdigest()}"
        if outcome == "remote_finalized":
            effect.finalize(remote_id=effect.remote_id, evidence=note)
        elif outcome == "no_effect":
            effect.prove_no_effect(evidence=note)
        else:
            raise V1ReconcileRefused(f"outcome {outcome!r} is not remote_finalized or no_effect")
        effect.save()
        if effect.work_item_id is not None:
            runtime.complete_if_finished(effect.work_item_id)
        return receipt("effect.reconciled", attempt_key, effect.request_key,
                       [("outcome", outcome), ("request_digest", bytes(effect.request_digest)),
                        ("evidence_digest", hashlib.sha256(evidence).digest())])

    def transport_identities(self, account_keys: list[str]) -> list[TransportIdentity]:
        return [TransportIdentity(i.account_key, i.source_key, i.transport_key.encode(), bytes(i.payload_digest),
                                  f"v1:workitem:{i.pk}")
                for i in V1WorkItem.objects.filter(account_key__in=account_keys).order_by("pk")]

    def high_waters(self, account_keys: list[str]) -> list[HighWater]:
        return [HighWater(w.account_key, w.route_key, w.partition.encode(), str(int(w.high_water)).encode(),
                          w.comparator)
                for w in V1HighWater.objects.filter(account_key__in=account_keys).order_by("pk")]

    def tables(self) -> tuple[str, ...]:
        models = (V1OutboundEffect, V1WorkItem, V1HighWater, V1SourceCursor, V1Barrier, V1ProcessGeneration)
        return tuple(m._meta.db_table for m in models)

    def boot_check(self, database_url: str, release: V1Release, attempt_key: str) -> Receipt:
        env = {**os.environ, "DATABASE_URL": database_url, "DJANGO_SETTINGS_MODULE": "config.django.local"}
        env.pop("TEST_DB_SUFFIX", None)
        done = subprocess.run([sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "v1_boot_check",
                               "--expect-release", release.release_id, "--expect-schema", release.schema_digest.hex(),
                               "--expect-binary", release.binary_digest.hex(), "--json"],
                              env=env, capture_output=True, text=True, timeout=120)
        try:
            report = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise V1BootCheckFailed(f"boot check printed no report: {done.stderr.strip()[-400:]}") from None
        if done.returncode != 0 or not report.get("ok"):
            raise V1BootCheckFailed("; ".join(report.get("problems", [])) or "boot check failed")
        return receipt("restore.boot_checked", attempt_key, release.release_id,
                       [("report", json.dumps(report, sort_keys=True))])


__all__ = ["V1Owner", "receipt", "schema_digest", "binary_digest"]
