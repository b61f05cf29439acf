-- The triggers effects keeps on effects_deliveryobservation (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_deliveryobservation_append_only ON effects_deliveryobservation;
CREATE TRIGGER effects_deliveryobservation_append_only BEFORE DELETE OR UPDATE ON effects_deliveryobservation
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_deliveryobservation_no_truncate ON effects_deliveryobservation;
CREATE TRIGGER effects_deliveryobservation_no_truncate BEFORE TRUNCATE ON effects_deliveryobservation
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
