"""PostgreSQL rules of the V1 tables: the transition tables of generations, work items and effects; a
terminated generation stays terminated and isolated egress never reopens; accepted items keep their bytes; and
the three owner barriers exist (open)."""
from django.db import migrations

from connector import dbrules
from v1.models import EFFECT_TRANSITIONS, GENERATION_TRANSITIONS, WORK_TRANSITIONS

EGRESS_FUNCTION = """
CREATE OR REPLACE FUNCTION v1_egress_never_reopens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.egress_isolated AND NOT NEW.egress_isolated THEN
    RAISE EXCEPTION 'V1 generation % has isolated provider egress: it never reopens', OLD.generation_id
      USING ERRCODE = '23000', CONSTRAINT = 'v1_generation_egress_never_reopens';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER v1_v1processgeneration_egress BEFORE UPDATE ON v1_v1processgeneration FOR EACH ROW
  EXECUTE FUNCTION v1_egress_never_reopens();
"""
EGRESS_DROP = ("DROP TRIGGER IF EXISTS v1_v1processgeneration_egress ON v1_v1processgeneration; "
               "DROP FUNCTION IF EXISTS v1_egress_never_reopens();")

RULES = [
    dbrules.transitions("v1_v1processgeneration", "state", GENERATION_TRANSITIONS),
    dbrules.only_columns_change("v1_v1processgeneration", ["state", "egress_isolated", "terminated_at"]),
    (EGRESS_FUNCTION, EGRESS_DROP),
    dbrules.transitions("v1_v1workitem", "state", WORK_TRANSITIONS),
    dbrules.only_columns_change("v1_v1workitem", ["state", "lease_generation", "lease_until"]),
    dbrules.transitions("v1_v1outboundeffect", "state", EFFECT_TRANSITIONS),
    dbrules.only_columns_change("v1_v1outboundeffect",
                                ["state", "dispatch_generation", "remote_id", "evidence", "changed_at"]),
    ("INSERT INTO v1_v1barrier (kind, closed, attempt_key, fence, changed_at) VALUES "
     "('ingress', false, '', 1, now()), ('root_outbound', false, '', 1, now()), ('authoring', false, '', 1, now())",
     "DELETE FROM v1_v1barrier"),
]


class Migration(migrations.Migration):
    dependencies = [("v1", "0001_v1_authority"), ("connector", "0002_db_rules")]

    operations = [migrations.RunSQL(create, drop) for create, drop in RULES]
