"""Poison items (decision D-168): StepFailure evidence (append-only in PostgreSQL) and the hold of a Receipt's
MaterializationDue row."""
from django.db import migrations, models

from connector import dbrules

APPEND_ONLY = dbrules.append_only("connector_stepfailure")


class Migration(migrations.Migration):

    dependencies = [
        ('connector', '0007_dual_approvals'),
    ]

    operations = [
        migrations.CreateModel(
            name='StepFailure',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('entity_type', models.CharField(max_length=100)),
                ('entity_id', models.CharField(max_length=255)),
                ('step', models.CharField(choices=[('receipt_materialize', 'Receipt Materialize'), ('lane_advance', 'Lane Advance'), ('lane_gap_deadline', 'Lane Gap Deadline'), ('window_seal_due', 'Window Seal Due'), ('dependency_resolve', 'Dependency Resolve'), ('execution_claim', 'Execution Claim'), ('execution_run', 'Execution Run'), ('epoch_verify', 'Epoch Verify'), ('effect_claim', 'Effect Claim'), ('permit_acquire', 'Permit Acquire'), ('effect_send', 'Effect Send'), ('effect_finalize', 'Effect Finalize'), ('delivery_step', 'Delivery Step'), ('delivery_recover_orphan', 'Delivery Recover Orphan')], max_length=64)),
                ('reason_code', models.CharField(choices=[('MATERIALIZATION_FAILED', 'Materialization Failed'), ('LANE_STEP_FAILED', 'Lane Step Failed'), ('WINDOW_SEAL_FAILED', 'Window Seal Failed'), ('EXECUTION_STEP_FAILED', 'Execution Step Failed'), ('EPOCH_VERIFY_FAILED', 'Epoch Verify Failed'), ('EFFECT_STEP_FAILED', 'Effect Step Failed'), ('DELIVERY_STEP_FAILED', 'Delivery Step Failed')], max_length=64)),
                ('exception_class', models.CharField(max_length=255)),
                ('message', models.TextField(blank=True, default='')),
            ],
            options={
                'ordering': ['-at', '-pk'],
            },
        ),
        migrations.AddField(
            model_name='materializationdue',
            name='held_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='materializationdue',
            name='held_reason',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddConstraint(
            model_name='materializationdue',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('held_at__isnull', True), ('held_reason', '')), models.Q(('held_at__isnull', False), ('held_reason', 'MATERIALIZATION_FAILED')), _connector='OR'), name='connector_materializationdue_hold_whole'),
        ),
        migrations.AddIndex(
            model_name='stepfailure',
            index=models.Index(fields=['entity_type', 'entity_id'], name='connector_stepfailure_entity'),
        ),
        migrations.AddConstraint(
            model_name='stepfailure',
            constraint=models.CheckConstraint(condition=models.Q(('step__in', ['receipt_materialize', 'lane_advance', 'lane_gap_deadline', 'window_seal_due', 'dependency_resolve', 'execution_claim', 'execution_run', 'epoch_verify', 'effect_claim', 'permit_acquire', 'effect_send', 'effect_finalize', 'delivery_step', 'delivery_recover_orphan'])), name='connector_stepfailure_step'),
        ),
        migrations.AddConstraint(
            model_name='stepfailure',
            constraint=models.CheckConstraint(condition=models.Q(('reason_code__in', ['MATERIALIZATION_FAILED', 'LANE_STEP_FAILED', 'WINDOW_SEAL_FAILED', 'EXECUTION_STEP_FAILED', 'EPOCH_VERIFY_FAILED', 'EFFECT_STEP_FAILED', 'DELIVERY_STEP_FAILED'])), name='connector_stepfailure_reason'),
        ),
        migrations.RunSQL(APPEND_ONLY[0], APPEND_ONLY[1], hints={"target_db": "default"}),
    ]
