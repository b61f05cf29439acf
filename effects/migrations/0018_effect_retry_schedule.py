"""Retries that outlast an outage (issue 37, D-420..D-421): the command's frozen retry schedule of attempts that
never reached the receiver (the database default is the product's default schedule, so existing and raw-SQL inserts
keep a policy), the effect's `next_attempt_at`, and the effect's changeable-column trigger re-created to admit it
(the transition table is unchanged)."""
from django.db import migrations, models

from connector import dbrules

EFFECT = "effects_remoteeffect"
BEFORE = ["state", "lease_holder", "lease_expires_at", "lease_fence", "attempt_count", "remote_id",
          "quarantine_reason", "changed_at"]
CREATE_BEFORE, DROP = dbrules.only_columns_change(EFFECT, BEFORE)
CREATE_AFTER, _ = dbrules.only_columns_change(EFFECT, [*BEFORE, "next_attempt_at"])


class Migration(migrations.Migration):

    dependencies = [
        ('effects', '0017_effect_owner_slot'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboundcommand',
            name='retry_schedule',
            field=models.JSONField(db_default=models.Value([5, 300, 1800, 7200, 18000, 36000, 36000], output_field=models.JSONField())),
        ),
        migrations.AddField(
            model_name='remoteeffect',
            name='next_attempt_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(DROP + CREATE_AFTER, DROP + CREATE_BEFORE, hints={"target_db": "default"}),
    ]
