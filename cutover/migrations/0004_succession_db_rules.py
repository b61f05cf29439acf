"""PostgreSQL enforces the barrier-set transition table, its fence and immutable binding columns, and keeps every
OrderingHandoff append-only (the default database; the functions come from connector's 0002_db_rules)."""
from django.db import migrations

from connector import dbrules
from cutover.choices import BARRIER_SET_TRANSITIONS

RULES = [
    dbrules.transitions("cutover_servingpublicationbarrierset", "state", BARRIER_SET_TRANSITIONS),
    dbrules.fenced("cutover_servingpublicationbarrierset", "state", "changed_at"),
    dbrules.only_columns_change("cutover_servingpublicationbarrierset",
                                ["state", "fence", "owner_receipts_digest", "release_reason", "changed_at"]),
    dbrules.append_only("cutover_orderinghandoff"),
]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0003_succession"), ("connector", "0002_db_rules")]

    operations = [migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES]
