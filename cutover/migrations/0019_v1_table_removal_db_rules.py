"""The V1 table removal record is append-only in PostgreSQL (CV2-12-078)."""
from django.db import migrations

from connector import dbrules

RULES = [dbrules.append_only("cutover_v1tableremoval")]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0018_v1_table_removal"), ("connector", "0002_db_rules")]

    operations = [migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES]
