from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("effects", "0003_attempt_settled_once")]

    operations = [
        migrations.AddField(model_name="outboundcommand", name="callout",
                            field=models.CharField(default="", max_length=255), preserve_default=False),
    ]
