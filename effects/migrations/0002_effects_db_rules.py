"""PostgreSQL-enforced rules of the outbound chain."""
from django.db import migrations

from connector import dbrules
from effects.choices import EFFECT_TRANSITIONS, HOLDER_TRANSITIONS, LINK_TRANSITIONS, PERMIT_TRANSITIONS

RULES = [
    dbrules.append_only("effects_outboundcommand"),
    dbrules.only_columns_change("effects_remoteeffect", [
        "state", "lease_holder", "lease_expires_at", "lease_fence", "attempt_count", "remote_id",
        "quarantine_reason", "changed_at"]),
    dbrules.transitions("effects_remoteeffect", "state", EFFECT_TRANSITIONS),
    dbrules.only_columns_change("effects_remoteeffectattempt", [
        "outcome", "response_status", "response_digest", "evidence", "settled_at"]),
    dbrules.transitions("effects_remoteeffectattempt", "outcome",
                        [("", "remote_confirmed"), ("", "uncertain"), ("", "no_effect")]),
    dbrules.only_columns_change("effects_dispatchpermit", [
        "state", "io_may_have_started", "sending_at", "closed_at", "abandonment_proof"]),
    dbrules.transitions("effects_dispatchpermit", "state", PERMIT_TRANSITIONS),
    dbrules.transitions("effects_remotelink", "state", LINK_TRANSITIONS),
    dbrules.only_columns_change("effects_processgeneration", [
        "state", "heartbeat_at", "terminated_at", "terminated_by", "termination_evidence"]),
    dbrules.transitions("effects_processgeneration", "state", HOLDER_TRANSITIONS),
]


class Migration(migrations.Migration):
    dependencies = [("effects", "0001_outbound_chain"), ("connector", "0004_inbound_db_rules")]

    operations = [
        migrations.RunSQL(dbrules.FUNCTIONS_SQL, migrations.RunSQL.noop, hints={"target_db": "default"}),
        *(migrations.RunSQL(create, drop, hints={"target_db": "default"}) for create, drop in RULES),
    ]
