"""The typed V1 predecessor ref of a replay (D-331): read-only evidence, immutable in the database."""

import django.db.models.deletion
from django.db import migrations, models

from connector import dbrules


class Migration(migrations.Migration):

    dependencies = [
        ('connector', '0021_epoch_large_columns_trigger'),
    ]

    operations = [
        migrations.CreateModel(
            name='V1PredecessorRef',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('protocol_version', models.CharField(max_length=64)),
                ('v1_receipt_channel', models.CharField(max_length=255)),
                ('v1_receipt_transport_key', models.CharField(max_length=255)),
                ('v1_event_id', models.CharField(max_length=255)),
                ('v1_work_item_id', models.CharField(max_length=255)),
                ('original_epoch', models.CharField(max_length=255)),
                ('payload_digest', models.BinaryField(max_length=32)),
                ('result_digest', models.BinaryField(max_length=32)),
                ('ref_digest', models.BinaryField(max_length=32)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
            ],
            options={
                'ordering': ['pk'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='event',
            name='connector_event_replay_has_predecessor',
        ),
        migrations.AlterField(
            model_name='replayrequest',
            name='predecessor_event',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='connector.event'),
        ),
        migrations.AddField(
            model_name='v1predecessorref',
            name='tombstone',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='connector.v1acceptancetombstone'),
        ),
        migrations.AddField(
            model_name='event',
            name='v1_predecessor',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='connector.v1predecessorref'),
        ),
        migrations.AddField(
            model_name='replayrequest',
            name='v1_predecessor',
            field=models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='replay_request', to='connector.v1predecessorref'),
        ),
        migrations.AddConstraint(
            model_name='event',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('replay_request__isnull', True), ('v1_predecessor__isnull', True)), models.Q(('predecessor__isnull', False), ('replay_request__isnull', False), ('v1_predecessor__isnull', True)), models.Q(('predecessor__isnull', True), ('replay_request__isnull', False), ('v1_predecessor__isnull', False)), _connector='OR'), name='connector_event_replay_has_predecessor'),
        ),
        migrations.AddConstraint(
            model_name='replayrequest',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('predecessor_event__isnull', False), ('v1_predecessor__isnull', True)), models.Q(('predecessor_event__isnull', True), ('v1_predecessor__isnull', False)), _connector='OR'), name='connector_replayrequest_one_predecessor'),
        ),
        migrations.AddConstraint(
            model_name='v1predecessorref',
            constraint=models.CheckConstraint(condition=models.Q(('original_epoch__startswith', 'v1:')), name='connector_v1predecessorref_v1_epoch'),
        ),
        migrations.AddConstraint(
            model_name='v1predecessorref',
            constraint=models.CheckConstraint(condition=models.Q(('v1_event_id__startswith', 'v1:event:'), ('v1_work_item_id__startswith', 'v1:workitem:')), name='connector_v1predecessorref_v1_identities'),
        ),
        migrations.RunSQL(*dbrules.immutable("connector_v1predecessorref"), hints={"target_db": "default"}),
    ]
