from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="governancescreens",
            options={"managed": False, "default_permissions": (),
                     "permissions": [("view_governance", "Can open the operator governance screens"),
                                     ("release_held_item",
                                      "Can release items held by a step failure once the fix is deployed")]},
        ),
    ]
