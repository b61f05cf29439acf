"""A TRUNCATE guard on every append-only and immutable table (issue 17): TRUNCATE bypasses the row triggers, so a
statement-level trigger refuses it as a second line beside the application role's missing TRUNCATE privilege.
Installs the new guard function on both databases, then guards the tables created before it existed; tables
created later get the guard from dbrules.append_only/immutable themselves."""
from django.db import migrations

from connector import dbrules

DROP_SQL = r"""
DO $$
DECLARE t record;
BEGIN
  FOR t IN SELECT g.tgname, c.relname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND g.tgname = c.relname || '_no_truncate'
  LOOP
    EXECUTE format('DROP TRIGGER %I ON %I', t.tgname, t.relname);
  END LOOP;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("connector", "0009_h6_lane_resumption_identity_approval"),
        ("effects", "0009_h6_remote_identity"),
        ("cutover", "0012_first_activation_barrier_set"),
    ]

    operations = [
        op
        for db in ("default", "journal")
        for op in (migrations.RunSQL(dbrules.FUNCTIONS_SQL, migrations.RunSQL.noop, hints={"target_db": db}),
                   migrations.RunSQL(dbrules.GUARD_EXISTING_SQL, DROP_SQL, hints={"target_db": db}))
    ]
