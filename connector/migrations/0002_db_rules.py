"""PostgreSQL-enforced immutability, append-only audit, transition tables and fence advance."""
from django.db import migrations

from connector import dbrules
from connector.choices import CREDENTIAL_GATE_TRANSITIONS, EPOCH_TRANSITIONS, GATE_TRANSITIONS

IMMUTABLE_TABLES = [
    "connector_packgeneration",
    "connector_bindingdefinition",
    "connector_integrationbindingview",
    "connector_catalogbinding",
    "connector_credentialgeneration",
    "connector_serviceconfigurationgeneration",
    "connector_serviceconfigurationaccount",
    "connector_serviceconfigurationcredentialmapping",
    "connector_servingepochbindingproof",
    "connector_servingepochcredentialproof",
]

RULES = [
    *(dbrules.immutable(t) for t in IMMUTABLE_TABLES),
    dbrules.append_only("connector_auditrecord"),
    dbrules.only_columns_change("connector_servingepoch",
                                ["state", "state_changed_at", "rejection_code", "rejection_detail"]),
    dbrules.transitions("connector_servingepoch", "state", EPOCH_TRANSITIONS),
    dbrules.transitions("connector_accountservinggate", "mode", GATE_TRANSITIONS),
    dbrules.fenced("connector_accountservinggate", "mode", "changed_at"),
    dbrules.transitions("connector_credentialgenerationdispatchgate", "mode", CREDENTIAL_GATE_TRANSITIONS),
    dbrules.fenced("connector_credentialgenerationdispatchgate", "mode", "changed_at"),
]


class Migration(migrations.Migration):
    dependencies = [("connector", "0001_owners_serving_audit")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, dbrules.DROP_FUNCTIONS_SQL, hints={"target_db": "default"}),
        *(migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES),
    ]
