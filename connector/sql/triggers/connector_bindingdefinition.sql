-- The triggers connector keeps on connector_bindingdefinition (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_bindingdefinition_immutable ON connector_bindingdefinition;
CREATE TRIGGER connector_bindingdefinition_immutable BEFORE UPDATE ON connector_bindingdefinition
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS connector_bindingdefinition_no_truncate ON connector_bindingdefinition;
CREATE TRIGGER connector_bindingdefinition_no_truncate BEFORE TRUNCATE ON connector_bindingdefinition
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
