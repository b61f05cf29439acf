"""A held DeliveryOperation (decision D-168): two columns, the constraint tying them together, and the
operation's changeable-column trigger re-created to admit them (the transition table is unchanged)."""
from django.db import migrations, models

from connector import dbrules

OPERATION = "effects_deliveryoperation"
BEFORE = ["state", "execution", "remote_effect", "acknowledgement", "verification", "checkpoint", "revision",
          "attempt_ordinal", "observation_ordinal", "next_attempt_after", "remote_receipt_id", "applied_count",
          "last_code", "last_detail", "reconciliation_id", "reconciled", "changed_at"]
CREATE_BEFORE, DROP = dbrules.only_columns_change(OPERATION, BEFORE)
CREATE_AFTER, _ = dbrules.only_columns_change(OPERATION, [*BEFORE, "held_reason", "held_at"])


class Migration(migrations.Migration):

    dependencies = [
        ('effects', '0007_reconcile_permission_digest_seen'),
    ]

    operations = [
        migrations.AddField(
            model_name='deliveryoperation',
            name='held_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='deliveryoperation',
            name='held_reason',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddConstraint(
            model_name='deliveryoperation',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('held_at__isnull', True), ('held_reason', '')), models.Q(('held_at__isnull', False), ('held_reason', 'DELIVERY_STEP_FAILED')), _connector='OR'), name='delivery_operation_hold_whole'),
        ),
        migrations.RunSQL(DROP + CREATE_AFTER, DROP + CREATE_BEFORE, hints={"target_db": "default"}),
    ]
