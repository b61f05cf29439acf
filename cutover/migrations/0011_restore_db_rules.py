"""The journal database keeps every V1RestorePoint and rehearsal append-only, and enforces the RestoreAttempt
transition table, its fence and the columns a transition may write."""
from django.db import migrations

from connector import dbrules
from cutover.choices import RESTORE_ATTEMPT_TRANSITIONS

RULES = [
    dbrules.append_only("cutover_v1restorepoint"),
    dbrules.append_only("cutover_restorepointrehearsal"),
    dbrules.transitions("cutover_restoreattempt", "state", RESTORE_ATTEMPT_TRANSITIONS),
    dbrules.fenced("cutover_restoreattempt", "state", "changed_at"),
    dbrules.only_columns_change("cutover_restoreattempt", [
        "state", "fence", "restored_content_digest", "recovery_payload", "recovery_digest", "v1_generation_id",
        "changed_at"]),
]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0010_restore_points"), ("cutover", "0002_decision_rules")]

    operations = [migrations.RunSQL(create, drop, hints={"target_db": "journal"}) for create, drop in RULES]
