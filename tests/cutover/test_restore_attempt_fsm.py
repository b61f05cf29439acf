"""The RestoreAttempt state machine: django-fsm declares exactly RESTORE_ATTEMPT_TRANSITIONS, and both
django-fsm and the journal database's trigger refuse every unlisted (source, target) pair."""
from __future__ import annotations

import itertools

import pytest
from django.db import IntegrityError, connections, transaction
from django_fsm import TransitionNotAllowed

from config.routers import JOURNAL_DB
from cutover.choices import RESTORE_ATTEMPT_TRANSITIONS, RestoreAttemptState
from cutover.models import RestoreAttempt, V1RestorePoint
from tests import dbroles

STATES = list(RestoreAttemptState.values)
LISTED = {(str(a), str(b)) for a, b in RESTORE_ATTEMPT_TRANSITIONS}
KWARGS = {"database_restored": {"content_digest": b"\x01" * 32},
          "record_receipt": {"payload": b"p", "digest": b"\x02" * 32}, "serve_v1": {"generation_id": "g"}}


def test_declared_transitions_are_exactly_the_table():
    """Proves: CV2-12-075 (the restore moves only forward through its durable boundaries)."""
    field = RestoreAttempt._meta.get_field("state")
    assert {(t.source, t.target) for t in field.get_all_transitions(RestoreAttempt)} == LISTED
    assert field.protected is True


def test_every_unlisted_pair_is_refused_by_django_fsm():
    """Proves: CV2-12-075 (no method moves a RestoreAttempt along an unlisted pair, e.g. back to `started`)."""
    methods = {t.name for t in RestoreAttempt._meta.get_field("state").get_all_transitions(RestoreAttempt)}
    for source, target in itertools.product(STATES, STATES):
        if source == target:
            continue
        reached = set()
        for name in methods:
            row = RestoreAttempt(state=source)
            try:
                getattr(row, name)(**KWARGS[name])
            except TransitionNotAllowed:
                continue
            reached.add(row.state)
        assert (target in reached) == ((source, target) in LISTED), (source, target)


@pytest.mark.django_db(databases=["default", "journal"], transaction=True)
def test_every_unlisted_pair_is_refused_by_the_journal_trigger():
    """Proves: CV2-12-075 (the journal database refuses every unlisted pair and any fence that does not advance by
    one, whatever the client)."""
    point = V1RestorePoint.objects.using(JOURNAL_DB).create(
        attempt_key="fsm", database_name="x", v1_release_id="r", dump_path="/x", dump_bytes=1, payload=b"p",
        captured_by="t", **{f: bytes([i + 1]) * 32 for i, f in enumerate((
            "v1_binary_digest", "v1_schema_digest", "v1_configuration_digest", "configuration_digest",
            "schema_digest", "content_digest", "cursors_digest", "account_gate_digest",
            "shutdown_certificate_digest", "identity_coverage_digest", "ordering_coverage_digest",
            "effect_evidence_digest", "dump_sha256", "digest"))})
    table = RestoreAttempt._meta.db_table
    with connections[JOURNAL_DB].cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        for i, source in enumerate(STATES):
            cursor.execute(f"INSERT INTO {table} (attempt_key, restore_point_id, state, fence, restored_content_digest,"
                           " recovery_payload, recovery_digest, v1_generation_id, started_by, changed_at, created_at)"
                           " VALUES (%s, %s, %s, 1, %s, %s, %s, 'g', 't', now(), now())",
                           [f"k{i}", point.pk, source, b"\x01" * 32, b"p", b"\x02" * 32])
        cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")
        dbroles.admin_off(cursor)
    for (i, source), target in itertools.product(enumerate(STATES), STATES):
        if source == target:
            continue
        update = f"UPDATE {table} SET state = %s, fence = fence + 1 WHERE attempt_key = %s"
        if (source, target) in LISTED:
            with transaction.atomic(using=JOURNAL_DB):
                with connections[JOURNAL_DB].cursor() as cursor:
                    cursor.execute(update, [target, f"k{i}"])
                transaction.set_rollback(True, using=JOURNAL_DB)
        else:
            with pytest.raises(IntegrityError), transaction.atomic(using=JOURNAL_DB):
                with connections[JOURNAL_DB].cursor() as cursor:
                    cursor.execute(update, [target, f"k{i}"])
    with pytest.raises(IntegrityError), transaction.atomic(using=JOURNAL_DB):
        with connections[JOURNAL_DB].cursor() as cursor:  # a transition that does not advance the fence
            cursor.execute(f"UPDATE {table} SET state = %s WHERE attempt_key = 'k0'",
                           [RestoreAttemptState.DATABASE_RESTORED])
    with pytest.raises(IntegrityError), transaction.atomic(using=JOURNAL_DB):
        with connections[JOURNAL_DB].cursor() as cursor:  # a binding column never changes
            cursor.execute(f"UPDATE {table} SET attempt_key = 'other' WHERE attempt_key = 'k0'")
