"""Every piece of V1 -> V2 cutover evidence up to `v1_drained` is append-only in PostgreSQL."""
from django.db import migrations

from connector import dbrules

RULES = [dbrules.append_only(f"cutover_{name}") for name in (
    "cutoverreadinesscertificate", "maintenancebarrierreceipt", "v1generationreceipt", "v1reconciliation",
    "orderingbaseline")]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0008_readiness_and_shutdown"), ("connector", "0002_db_rules")]

    operations = [migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES]
