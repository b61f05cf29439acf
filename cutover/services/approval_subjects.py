"""The cutover subjects that need dual approval, as digests recomputed from the durable facts (registered with
connector.services.approvals when the app is ready).

- `activation_decision` (key: the verified ServingEpoch ID): the epoch's exact ID and digest, its configuration
  generation, and the exhaustive account/gate set it would activate. Any change to one of them is a new digest,
  which voids earlier approvals.
- `readiness_certificate` (key: the service cutover attempt): the certificate's exact digest (its bytes bind the
  epoch, configuration, routes, budgets, measurements and projections). Required before the barriers close.
- `restore_point` (key: the service cutover attempt): the V1RestorePoint's digest and the digest of its latest
  rehearsal. Required before validation begins.
"""
from __future__ import annotations

from django.db import connection

from config.routers import JOURNAL_DB
from connector.canonical.encoding import Record
from connector.canonical.encoding import digest as canonical_digest
from connector.canonical.shapes import text_list
from connector.errors import EpochNotFound, TransitionRefused
from connector.selectors.rows import (AccountServingGate, ConnectorAccount, ServiceConfigurationAccount,
                                      ServingEpoch)
from connector.services import approvals
from cutover.models import CutoverReadinessCertificate, RestorePointRehearsal, V1RestorePoint

DOMAIN = "nexuscrm.cutover.approval-subject.v1"


# The configuration's accounts in account-key order with their gate (NULL: none) and its mode: the digest lists
# (key, gate); the first-activation coordinator reads its account set and gates from the same rows (D-289).
ACCOUNT_GATE_SET_SQL = f"""
SELECT c.account_id, a.account_key, g.id, g.mode FROM {ServiceConfigurationAccount._meta.db_table} AS c
  JOIN {ConnectorAccount._meta.db_table} AS a ON a.id = c.account_id
  LEFT JOIN {AccountServingGate._meta.db_table} AS g ON g.account_id = c.account_id
 WHERE c.generation_id = %s ORDER BY a.account_key
"""


def account_gate_rows(configuration_pk: int) -> list[tuple[int, str, int | None, str | None]]:
    """(account id, account key, gate pk or None, gate mode or None) of every account of the configuration, in
    account-key order, one statement."""
    with connection.cursor() as cursor:
        cursor.execute(ACCOUNT_GATE_SET_SQL, [configuration_pk])
        return cursor.fetchall()


def activation_decision(subject_key: str, *, rows=None) -> tuple[bytes, str]:
    """The subject's digest and summary. `rows`: the epoch configuration's `account_gate_rows`, when the caller
    read them already."""
    epoch = (ServingEpoch.objects.select_related("configuration").defer("preimage", "configuration__payload")
             .filter(epoch_id=subject_key).first())
    if epoch is None:
        raise EpochNotFound(f"no ServingEpoch {subject_key!r}")
    rows = rows if rows is not None else account_gate_rows(epoch.configuration_id)
    gate_count = sum(1 for _, _, pk, _ in rows if pk is not None)
    value = Record([("kind", "activation_decision"), ("epoch_id", epoch.epoch_id),
                    ("epoch_digest", bytes(epoch.digest)), ("epoch_state", epoch.state),
                    ("configuration", epoch.configuration.generation_id),
                    # one Encoded list (the generic encoding's bytes, a fifth of its time: D-289)
                    ("gate_set", text_list([key, -1 if pk is None else pk] for _, key, pk, _ in rows))])
    summary = (f"Activate ServingEpoch {epoch.epoch_id} ({epoch.state}, digest {bytes(epoch.digest).hex()[:16]}…) "
               f"for configuration {epoch.configuration.generation_id}: {len(rows)} accounts, "
               f"{gate_count} gates")
    return canonical_digest(DOMAIN, value), summary


def readiness_certificate(subject_key: str) -> tuple[bytes, str]:
    row = CutoverReadinessCertificate.objects.filter(attempt__attempt_key=subject_key).first()
    if row is None:
        raise TransitionRefused(f"attempt {subject_key!r} has no readiness certificate")
    value = Record([("kind", "readiness_certificate"), ("attempt", subject_key), ("digest", bytes(row.digest))])
    routes = ", ".join(f"{r['route']}: {r['disposition']}" for r in row.routes)
    return canonical_digest(DOMAIN, value), (f"Readiness certificate of cutover {subject_key}: epoch {row.epoch_id}, "
                                             f"configuration {row.configuration_generation_id}, routes {routes}")


def restore_point(subject_key: str) -> tuple[bytes, str]:
    point = V1RestorePoint.objects.using(JOURNAL_DB).filter(attempt_key=subject_key).first()
    rehearsal = (RestorePointRehearsal.objects.using(JOURNAL_DB).filter(restore_point=point).order_by("-pk").first()
                 if point else None)
    if point is None or rehearsal is None:
        raise TransitionRefused(f"attempt {subject_key!r} has no rehearsed restore point")
    value = Record([("kind", "restore_point"), ("attempt", subject_key), ("digest", bytes(point.digest)),
                    ("rehearsal", bytes(rehearsal.digest))])
    return canonical_digest(DOMAIN, value), (f"V1 restore point of cutover {subject_key}: {point.dump_bytes} bytes, "
                                             f"release {point.v1_release_id}, rehearsed in {rehearsal.scratch_database}")


def activation_outcome(request) -> str | None:
    """What became of an approved activation decision: the epoch left `verified` by activation (it is active, or
    later draining or retired), or None while it waits. A rejected epoch is not an outcome: its approval counts for
    nothing, as the changed digest says."""
    epoch = ServingEpoch.objects.only("epoch_id", "state").filter(epoch_id=request.subject_key).first()
    if epoch is None or epoch.state not in ("active", "draining", "retired"):
        return None
    return (f"Taken: ServingEpoch {epoch.epoch_id} was activated and is now {epoch.state}; the activation decision "
            "this approval guarded has run.")


OUTCOMES = {"activation_decision": activation_outcome}

SUBJECTS = {"activation_decision": activation_decision, "readiness_certificate": readiness_certificate,
            "restore_point": restore_point}


def require(kind: str, subject_key: str) -> None:
    """Pass only if the subject's current digest has its dual approval (connector.services.approvals)."""
    digest, _ = SUBJECTS[kind](subject_key)
    approvals.approval_require(kind=kind, subject_key=subject_key, digest=digest)
