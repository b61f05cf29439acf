from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("effects", "0006_delivery_db_rules")]

    operations = [
        migrations.AlterModelOptions(
            name="remoteeffect",
            options={"ordering": ["pk"], "permissions": [
                ("reconcile_effect", "Can reconcile an uncertain remote effect with evidence")]},
        ),
        migrations.AddField(
            model_name="certificationapproval",
            name="digest_seen",
            field=models.BinaryField(max_length=32, default=b""),
            preserve_default=False,
        ),
    ]
