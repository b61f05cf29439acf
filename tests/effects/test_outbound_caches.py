"""Outbound authoring reads its frozen facts once per process: bindings, definitions, the epoch's profile and
configuration, and the account's credential mapping are cached by the exact identity of immutable rows (the
epoch's pk *and* digest, the configuration generation's pk), so authoring a command costs a pinned number of
statements and a cache can never serve another generation's facts (issue 20, decision D-220)."""
from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connector.demo import build_world
from connector.models import PackGeneration
from effects.errors import OutboundRefused
from effects.services.outbound import clear_caches, frozen_binding
from tests.effects.helpers import CALLOUT, PUSH_CONTRACT, author

# Measured on a warm process (decision D-220), inside a transaction that already holds the guard: the savepoints, the existing-key
# read, the command and effect inserts. 15 before the caches: 8 more re-read immutable owner facts, one of them the
# epoch with its preimage, whose size grows with the number of accounts in the service.
AUTHORING_STATEMENTS = 7


@pytest.mark.django_db
def test_authoring_a_command_costs_a_pinned_number_of_statements(push_world):
    """Proves: CV2-10-006, CV2-10-011"""
    acme, _ = push_world.accounts
    clear_caches()
    author(acme, root="warm-1", record_id="w1")
    with CaptureQueriesContext(connection) as queries:
        command = author(acme, root="order-2", record_id="r2")
    statements = [q["sql"] for q in queries.captured_queries]
    assert command.pk is not None
    assert len(statements) <= AUTHORING_STATEMENTS, "\n".join(statements)
    assert not any("connector_packgeneration" in sql or "connector_bindingdefinition" in sql for sql in statements)


@pytest.mark.django_db
def test_the_binding_cache_is_keyed_by_the_exact_epoch_identity(push_world):
    """Two epochs of two configurations: each exact (pk, digest) gets its own pack generation; a digest that does
    not belong to the pk is refused and never served from the other epoch's entry, even after both are cached.
    Proves: CV2-02-026, CV2-10-007"""
    other = build_world("q-", push=True)
    clear_caches()
    mine, theirs = push_world.active_epoch, other.active_epoch
    a = frozen_binding(epoch_pk=mine.pk, epoch_digest=bytes(mine.digest), kind="push_contract",
                       business_key=PUSH_CONTRACT)
    b = frozen_binding(epoch_pk=theirs.pk, epoch_digest=bytes(theirs.digest), kind="push_contract",
                       business_key=PUSH_CONTRACT)
    assert a.pack_generation_pk == PackGeneration.objects.get(generation_id="p-callout-pack.g1").pk
    assert b.pack_generation_pk == PackGeneration.objects.get(generation_id="q-callout-pack.g1").pk
    with CaptureQueriesContext(connection) as queries:
        again = frozen_binding(epoch_pk=mine.pk, epoch_digest=bytes(mine.digest), kind="push_contract",
                               business_key=PUSH_CONTRACT)
    assert again == a and len(queries.captured_queries) == 0
    for pk, digest in ((mine.pk, bytes(theirs.digest)), (theirs.pk, bytes(mine.digest)), (mine.pk, b"\0" * 32)):
        with pytest.raises(OutboundRefused):
            frozen_binding(epoch_pk=pk, epoch_digest=digest, kind="callout_profile", business_key=CALLOUT)


@pytest.mark.django_db
def test_an_absent_binding_is_not_cached(push_world):
    """A refusal is re-read every time (a later row would be found); only verified facts are kept."""
    epoch = push_world.active_epoch
    clear_caches()
    for _ in range(2):
        with CaptureQueriesContext(connection) as queries, pytest.raises(OutboundRefused):
            with transaction.atomic():
                frozen_binding(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), kind="push_contract",
                               business_key="no.such.contract")
        assert any("connector_servingepochbindingproof" in q["sql"] for q in queries.captured_queries)


def test_a_new_database_session_starts_with_empty_caches(transactional_db):
    """A restore of the database terminates every application session and may bring back primary keys that a
    cache saw (cutover/services/pg_snapshot.restore_default); every frozen-fact cache is therefore emptied when
    the process opens a new session, so no entry outlives the session it was read in."""
    from connector.selectors import routes
    from tests.effects.helpers import build_push_world

    world = build_push_world()
    epoch = world.active_epoch
    frozen_binding(epoch_pk=epoch.pk, epoch_digest=bytes(epoch.digest), kind="push_contract",
                   business_key=PUSH_CONTRACT)
    from effects.services import outbound
    assert outbound._frozen_binding.cache_info().currsize == 1
    routes.clear_caches()  # entries left by earlier tests of this process do not count
    routes._mapping(b"x" * 32, -1, "none")  # an entry in the connector's route caches too
    assert routes._mapping.cache_info().currsize == 1
    connection.close()
    connection.ensure_connection()
    assert outbound._frozen_binding.cache_info().currsize == 0
    assert routes._mapping.cache_info().currsize == 0
