"""ServingEpoch's database rules without jsonb: the generic triggers (`connector_only_columns_change`,
`connector_enforce_transition`) pass the whole row to `to_jsonb`, which detoasts the preimage (123 MB at 100,000
accounts), makes PostgreSQL store it again on every epoch transition (28 MB of WAL measured at 100,000 accounts),
and fails beyond jsonb's string limit (about 109,000 accounts). This trigger compares the immutable columns by name
and checks the transition edges on `state` alone (bench activation, docs/benchmarks.md finding 3)."""
from django.db import migrations

from connector import dbrules
from connector.choices import EPOCH_TRANSITIONS

EDGES = ", ".join(f"'{a}>{b}'" for a, b in EPOCH_TRANSITIONS)

CREATE = f"""
CREATE OR REPLACE FUNCTION connector_servingepoch_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id IS DISTINCT FROM OLD.id OR NEW.epoch_id IS DISTINCT FROM OLD.epoch_id
     OR NEW.profile_id IS DISTINCT FROM OLD.profile_id
     OR NEW.serving_scope_digest IS DISTINCT FROM OLD.serving_scope_digest
     OR NEW.catalog_view_id IS DISTINCT FROM OLD.catalog_view_id
     OR NEW.configuration_id IS DISTINCT FROM OLD.configuration_id
     OR NEW.configuration_receipt IS DISTINCT FROM OLD.configuration_receipt
     OR NEW.configuration_receipt_digest IS DISTINCT FROM OLD.configuration_receipt_digest
     OR NEW.digest IS DISTINCT FROM OLD.digest OR NEW.created_at IS DISTINCT FROM OLD.created_at
     OR NEW.preimage IS DISTINCT FROM OLD.preimage THEN
    RAISE EXCEPTION 'immutable columns of connector_servingepoch changed (only state, state_changed_at, '
      'rejection_code, rejection_detail may change)'
      USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_immutable_columns';
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state AND NOT (OLD.state || '>' || NEW.state = ANY (ARRAY[{EDGES}])) THEN
    RAISE EXCEPTION 'transition % -> % is not allowed on connector_servingepoch', OLD.state, NEW.state
      USING ERRCODE = '23514', CONSTRAINT = 'connector_servingepoch_transition';
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS connector_servingepoch_immutable_columns ON connector_servingepoch;
DROP TRIGGER IF EXISTS connector_servingepoch_transition ON connector_servingepoch;
CREATE TRIGGER connector_servingepoch_rules BEFORE UPDATE ON connector_servingepoch FOR EACH ROW
  EXECUTE FUNCTION connector_servingepoch_rules();
"""

DROP = "\n".join([
    "DROP TRIGGER IF EXISTS connector_servingepoch_rules ON connector_servingepoch;",
    "DROP FUNCTION IF EXISTS connector_servingepoch_rules();",
    dbrules.only_columns_change("connector_servingepoch",
                                ["state", "state_changed_at", "rejection_code", "rejection_detail"])[0],
    dbrules.transitions("connector_servingepoch", "state", EPOCH_TRANSITIONS)[0],
])


class Migration(migrations.Migration):
    dependencies = [("connector", "0005_permissions")]

    operations = [migrations.RunSQL(CREATE, DROP, hints={"target_db": "default"})]
