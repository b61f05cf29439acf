"""A set subject for dual approval (D-494): the kind `remote_identity_change_set` and the append-only stored
membership of a set request (each member with the digest the requester saw); applies connector's SQL files again,
which now hold the membership's append-only triggers (connector/sql/triggers/connector_dualapprovalsetmember.sql)."""

import django.db.models.deletion
import django.db.models.functions.text
import django.db.models.lookups
from django.conf import settings
from django.db import migrations, models

from connector import sqlfiles


class Migration(migrations.Migration):

    dependencies = [
        ('connector', '0027_analyze_unanalyzed'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='DualApprovalSetMember',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('ordinal', models.PositiveIntegerField()),
                ('member_key', models.CharField(max_length=255)),
                ('member_digest', models.BinaryField(max_length=32)),
                ('summary', models.TextField()),
            ],
            options={
                'ordering': ['request', 'ordinal'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='dualapprovalrequest',
            name='connector_dualapproval_kind',
        ),
        migrations.AlterField(
            model_name='dualapprovalrequest',
            name='kind',
            field=models.CharField(choices=[('readiness_certificate', 'readiness certificate'), ('restore_point', 'restore point'), ('activation_decision', 'activation decision'), ('remote_identity_change', 'remote identity change'), ('remote_identity_change_set', 'set of remote identity changes')], max_length=32),
        ),
        migrations.AddConstraint(
            model_name='dualapprovalrequest',
            constraint=models.CheckConstraint(condition=models.Q(('kind__in', ['readiness_certificate', 'restore_point', 'activation_decision', 'remote_identity_change', 'remote_identity_change_set'])), name='connector_dualapproval_kind'),
        ),
        migrations.AddField(
            model_name='dualapprovalsetmember',
            name='request',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='members', to='connector.dualapprovalrequest'),
        ),
        migrations.AddConstraint(
            model_name='dualapprovalsetmember',
            constraint=models.UniqueConstraint(fields=('request', 'member_key'), name='connector_dualapprovalset_member_once'),
        ),
        migrations.AddConstraint(
            model_name='dualapprovalsetmember',
            constraint=models.UniqueConstraint(fields=('request', 'ordinal'), name='connector_dualapprovalset_ordinal_once'),
        ),
        migrations.AddConstraint(
            model_name='dualapprovalsetmember',
            constraint=models.CheckConstraint(condition=django.db.models.lookups.Exact(django.db.models.functions.text.Length('member_digest'), 32), name='connector_dualapprovalset_digest_length'),
        ),
        *sqlfiles.operations("connector"),
    ]
