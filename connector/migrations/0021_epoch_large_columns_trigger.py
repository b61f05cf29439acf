"""ServingEpoch's two large columns (`preimage`, about 120 bytes per account, and `configuration_receipt`) are
compared by their own trigger, which fires only when an UPDATE names one of them (`BEFORE UPDATE OF`): a column an
UPDATE does not name cannot change (no other BEFORE trigger of the table assigns them), so the state transitions,
which name only the state columns, no longer detoast and compare the 12 MB preimage twice per epoch at 10,000
accounts (12-15 ms per epoch UPDATE in the successor activation, issue 19, D-289). The refusal and its constraint
name are the same as before (`connector_servingepoch_immutable_columns`)."""
from django.db import migrations

from connector.choices import EPOCH_TRANSITIONS

EDGES = ", ".join(f"'{a}>{b}'" for a, b in EPOCH_TRANSITIONS)

REFUSE = """
    RAISE EXCEPTION 'immutable columns of connector_servingepoch changed (only state, state_changed_at, '
      'rejection_code, rejection_detail may change)'
      USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_immutable_columns';"""

RULES = f"""
CREATE OR REPLACE FUNCTION connector_servingepoch_rules() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id IS DISTINCT FROM OLD.id OR NEW.epoch_id IS DISTINCT FROM OLD.epoch_id
     OR NEW.profile_id IS DISTINCT FROM OLD.profile_id
     OR NEW.serving_scope_digest IS DISTINCT FROM OLD.serving_scope_digest
     OR NEW.catalog_view_id IS DISTINCT FROM OLD.catalog_view_id
     OR NEW.configuration_id IS DISTINCT FROM OLD.configuration_id
     OR NEW.configuration_receipt_digest IS DISTINCT FROM OLD.configuration_receipt_digest
     OR NEW.digest IS DISTINCT FROM OLD.digest OR NEW.created_at IS DISTINCT FROM OLD.created_at{{extra}} THEN{REFUSE}
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state AND NOT (OLD.state || '>' || NEW.state = ANY (ARRAY[{EDGES}])) THEN
    RAISE EXCEPTION 'transition % -> % is not allowed on connector_servingepoch', OLD.state, NEW.state
      USING ERRCODE = '23514', CONSTRAINT = 'connector_servingepoch_transition';
  END IF;
  RETURN NEW;
END $$;
"""

CREATE = RULES.replace("{extra}", "") + f"""
CREATE OR REPLACE FUNCTION connector_servingepoch_large_columns() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.preimage IS DISTINCT FROM OLD.preimage
     OR NEW.configuration_receipt IS DISTINCT FROM OLD.configuration_receipt THEN{REFUSE}
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER connector_servingepoch_large_columns BEFORE UPDATE OF preimage, configuration_receipt
  ON connector_servingepoch FOR EACH ROW EXECUTE FUNCTION connector_servingepoch_large_columns();
"""

DROP = """
DROP TRIGGER IF EXISTS connector_servingepoch_large_columns ON connector_servingepoch;
DROP FUNCTION IF EXISTS connector_servingepoch_large_columns();
""" + RULES.replace("{extra}", """
     OR NEW.configuration_receipt IS DISTINCT FROM OLD.configuration_receipt
     OR NEW.preimage IS DISTINCT FROM OLD.preimage""")


class Migration(migrations.Migration):
    dependencies = [("connector", "0020_servingepoch_retire_permission")]

    operations = [migrations.RunSQL(CREATE, DROP, hints={"target_db": "default"})]
