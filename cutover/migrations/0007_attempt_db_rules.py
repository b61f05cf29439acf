"""PostgreSQL keeps the attempt's bindings fixed (only its outcome is written, once: closed_at settles it) and
every V1ShutdownCertificate append-only."""
from django.db import migrations

from connector import dbrules

RULES = [
    dbrules.only_columns_change("cutover_servicecutoverattempt", ["outcome", "closed_at"]),
    dbrules.settled_once("cutover_servicecutoverattempt", "closed_at"),
    dbrules.append_only("cutover_v1shutdowncertificate"),
]


class Migration(migrations.Migration):
    dependencies = [("cutover", "0006_service_cutover_attempt"), ("connector", "0002_db_rules")]

    operations = [migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES]
