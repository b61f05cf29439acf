"""PostgreSQL-enforced rules of REST bulk delivery: immutable and append-only facts, the operation's transition
edges exactly as the contract lists them, the columns a transition may change, and the contract's monotonic
fields."""
from django.db import migrations

from connector import dbrules
from effects.delivery.contract import contract


def monotonic(table: str, column: str) -> tuple[str, str]:
    name = f"{table}_monotonic_{column}"
    return (f"CREATE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW "
            f"EXECUTE FUNCTION connector_never_decreases('{column}');",
            f"DROP TRIGGER IF EXISTS {name} ON {table};")


def edges(table: str, column: str, allowed) -> tuple[str, str]:
    """dbrules.transitions with a per-column trigger name (a table may have two such columns)."""
    create, _ = dbrules.transitions(table, column, allowed)
    name = f"{table}_transition_{column}"
    create = create.replace(f"TRIGGER {table}_transition ", f"TRIGGER {name} ", 1)
    return create, f"DROP TRIGGER IF EXISTS {name} ON {table};"


OPERATION = "effects_deliveryoperation"
RULES = [
    dbrules.immutable("effects_deliveryapprovalreceipt"),
    dbrules.immutable("effects_receiverbinding"),
    dbrules.append_only("effects_receiversecretversion"),
    dbrules.only_columns_change("effects_receivercertification", ["state", "certified_at"]),
    dbrules.append_only("effects_certificationapproval"),
    dbrules.immutable("effects_deliveryprofile"),
    dbrules.only_columns_change("effects_remotejobsemaphore", ["capacity"]),
    dbrules.immutable("rest_delivery_effect_domain_lock"),
    dbrules.only_columns_change("effects_deliveryparent", [
        "state", "snapshot_closed_at", "planner_algorithm_version", "compiled_plan_digest", "coverage_proof",
        "parent_plan_digest", "admitted_at", "contiguous_checkpoint_frontier"]),
    dbrules.transitions("effects_deliveryparent", "state", [("PLANNING", "ADMITTED")]),
    monotonic("effects_deliveryparent", "contiguous_checkpoint_frontier"),
    dbrules.only_columns_change(OPERATION, [
        "state", "execution", "remote_effect", "acknowledgement", "verification", "checkpoint", "revision",
        "attempt_ordinal", "observation_ordinal", "next_attempt_after", "remote_receipt_id", "applied_count",
        "last_code", "last_detail", "reconciliation_id", "reconciled", "changed_at"]),
    dbrules.transitions(OPERATION, "state", sorted(contract().edges())),
    monotonic(OPERATION, "revision"),
    monotonic(OPERATION, "attempt_ordinal"),
    monotonic(OPERATION, "observation_ordinal"),
    dbrules.immutable("effects_mayattemptmarker"),
    dbrules.only_columns_change("effects_deliveryattempt", [
        "capacity_state", "capacity_released_reason", "io_may_have_started", "io_started_at", "outcome",
        "response_status", "response_digest", "evidence", "settled_at"]),
    dbrules.transitions("effects_deliveryattempt", "capacity_state",
                        [("reserved", "released"), ("reserved", "transferred")]),
    edges("effects_deliveryattempt", "outcome", [("", "not_started"), ("", "answered"), ("", "ambiguous")]),
    dbrules.append_only("effects_deliveryobservation"),
    dbrules.append_only("effects_deliveryreconciliation"),
    dbrules.transitions("effects_mutationgate", "state", [("ENABLED", "BLOCKED"), ("BLOCKED", "ENABLED")]),
    monotonic("effects_mutationgate", "journal_epoch"),
    dbrules.only_columns_change("effects_reconciliationcampaign", ["findings", "completed_at"]),
]


class Migration(migrations.Migration):
    dependencies = [("effects", "0005_delivery")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, migrations.RunSQL.noop, hints={"target_db": "default"}),
        *(migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES),
    ]
