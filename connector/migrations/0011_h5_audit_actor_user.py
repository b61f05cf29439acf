from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [('connector', '0010_h5_truncate_guards')]

    operations = [
        migrations.AddField(model_name="auditrecord", name="actor_user_id",
                            field=models.BigIntegerField(blank=True, null=True)),
    ]
