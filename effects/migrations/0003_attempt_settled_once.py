"""A settled attempt (outcome written) is immutable evidence: its response and evidence are never rewritten."""
from django.db import migrations

from connector import dbrules

CREATE, DROP = dbrules.settled_once("effects_remoteeffectattempt", "outcome")


class Migration(migrations.Migration):
    dependencies = [("effects", "0002_effects_db_rules")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, migrations.RunSQL.noop, hints={"target_db": "default"}),
        migrations.RunSQL(CREATE, DROP, hints={"target_db": "default"}),
    ]
