"""The placement data of the scale-out path covers every table and obeys Citus's rules (issue 23,
docs/scale-out.md, D-240): every table of both databases has one placement; distributed tables have their column
or name the parent it is filled from; foreign keys only go where Citus allows them."""
from __future__ import annotations

from collections import defaultdict

import pytest
from django.apps import apps
from django.db import connection, connections

from connector import placement


def _tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r[0] for r in cursor.fetchall()}


@pytest.mark.django_db(databases=["default", "journal"])
def test_every_table_has_a_placement():
    """Every table of both databases (models, m2m tables and anything a migration created with RunSQL, as the
    catalog shows them) has exactly one placement, and no placement names a table that does not exist."""
    default, journal = _tables("default"), _tables("journal")
    assert default == set(placement.DEFAULT), (sorted(default - set(placement.DEFAULT)),
                                               sorted(set(placement.DEFAULT) - default))
    assert journal == set(placement.JOURNAL_TABLES), (sorted(journal - set(placement.JOURNAL_TABLES)),
                                                      sorted(set(placement.JOURNAL_TABLES) - journal))


@pytest.mark.django_db
def test_placements_are_consistent_with_the_schema():
    """A distributed table has its distribution column today or names the parent it is backfilled from (never
    both); only distributed tables name a column or group; every backfill parent is a distributed table of the
    same group or an owner the row references."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema='public'")
        columns = defaultdict(set)
        for table, column in cursor.fetchall():
            columns[table].add(column)
    for table, p in placement.DEFAULT.items():
        assert p.kind in placement.KINDS, table
        if p.kind != placement.DISTRIBUTED:
            assert not (p.column or p.group or p.backfill), table
            continue
        assert p.group in (placement.ACCOUNT, placement.DOMAIN), table
        has = p.column in columns[table]
        assert has != bool(p.backfill), (table, p.column, p.backfill)
        if p.backfill and p.backfill[1] in placement.DEFAULT:
            assert p.backfill[0] in columns[table], (table, p.backfill)
    for key, why in {**placement.KNOWN_UNROUTABLE, **placement.SINGLE_NODE_ONLY}.items():
        table = key[1].split(",")[0]
        assert key[0] in placement.HOT_STEPS and (table in placement.DEFAULT or table in placement.ROUTINES), key
        assert why, key


#: (referencing kind, referenced kind) pairs Citus accepts for a foreign key: co-located distributed tables (the key
#: then includes the distribution column), distributed or local to reference, reference to reference, local to
#: local. Never reference -> distributed/local or distributed -> local (docs/scale-out.md, "Foreign keys").
ALLOWED_FOREIGN_KEYS = {(placement.DISTRIBUTED, placement.REFERENCE), (placement.REFERENCE, placement.REFERENCE),
                        (placement.LOCAL, placement.REFERENCE), (placement.LOCAL, placement.LOCAL)}


def test_every_foreign_key_is_one_citus_allows():
    """Each foreign key of the default database joins tables whose placements Citus can keep it between: within
    one co-location group, or towards a reference table, or between coordinator-local tables."""
    refused = []
    for model in apps.get_models(include_auto_created=True):
        table = model._meta.db_table
        if getattr(model, "journal_database", False) or not model._meta.managed:
            continue
        p = placement.DEFAULT[table]
        for field in model._meta.concrete_fields:
            if not field.is_relation:
                continue
            q = placement.DEFAULT[field.related_model._meta.db_table]
            if (p.kind, q.kind) == (placement.DISTRIBUTED, placement.DISTRIBUTED):
                if p.group != q.group:
                    refused.append((table, field.column, "another co-location group"))
            elif (p.kind, q.kind) not in ALLOWED_FOREIGN_KEYS:
                refused.append((table, field.column, f"{p.kind} -> {q.kind}"))
    assert not refused, refused
