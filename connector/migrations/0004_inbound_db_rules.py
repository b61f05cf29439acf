"""PostgreSQL-enforced rules of the inbound chain: immutable facts, append-only decisions, transition tables,
and a lane high-water that never moves back."""
from django.db import migrations

from connector import dbrules
from connector.choices import DEPENDENCY_TRANSITIONS, EXECUTION_TRANSITIONS, WINDOW_TRANSITIONS

IMMUTABLE = [
    "connector_v1acceptancetombstone", "connector_replayrequest", "connector_receipt", "connector_receiptadmissionkey",
    "connector_receiptcomponent", "connector_event", "connector_windowmember", "connector_executionattempt",
    "connector_supersededdecision", "connector_gapdecision", "connector_applicationresult",
]

RULES = [
    *(dbrules.append_only(t) for t in IMMUTABLE),
    dbrules.only_columns_change("connector_projection", ["execution_generation", "lane_status"]),
    dbrules.only_columns_change("connector_execution", [
        "state", "lease_holder", "lease_expires_at", "lease_fence", "attempt_count", "result_outcome",
        "result_digest", "runtime_receipt", "quarantine_reason", "changed_at"]),
    dbrules.transitions("connector_execution", "state", EXECUTION_TRANSITIONS),
    dbrules.only_columns_change("connector_projectionwindow", ["state", "member_count", "sealed_at",
                                                               "quarantine_reason"]),
    dbrules.transitions("connector_projectionwindow", "state", WINDOW_TRANSITIONS),
    dbrules.only_columns_change("connector_executiondependency", ["state", "resolved_at", "evidence"]),
    dbrules.transitions("connector_executiondependency", "state", DEPENDENCY_TRANSITIONS),
    dbrules.never_decreases("connector_orderinglane", "high_water"),
]


class Migration(migrations.Migration):
    dependencies = [("connector", "0003_inbound_chain")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, migrations.RunSQL.noop, hints={"target_db": "default"}),
        *(migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES),
    ]
