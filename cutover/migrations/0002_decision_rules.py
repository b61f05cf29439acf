"""The journal database enforces the CutoverDecision transition table and fence itself."""
from django.db import migrations

from connector import dbrules
from cutover.choices import DECISION_TRANSITIONS

RULES = [
    dbrules.transitions("cutover_cutoverdecision", "state", DECISION_TRANSITIONS),
    dbrules.fenced("cutover_cutoverdecision", "state", "changed_at"),
]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0001_cutover_decision_journal")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, dbrules.DROP_FUNCTIONS_SQL, hints={"target_db": "journal"}),
        *(migrations.RunSQL(create, drop, hints={"target_db": "journal"}) for create, drop in RULES),
    ]
