-- The triggers effects keeps on rest_delivery_effect_domain_lock (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS rest_delivery_effect_domain_lock_immutable ON rest_delivery_effect_domain_lock;
CREATE TRIGGER rest_delivery_effect_domain_lock_immutable BEFORE UPDATE ON rest_delivery_effect_domain_lock
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update();

DROP TRIGGER IF EXISTS rest_delivery_effect_domain_lock_no_truncate ON rest_delivery_effect_domain_lock;
CREATE TRIGGER rest_delivery_effect_domain_lock_no_truncate BEFORE TRUNCATE ON rest_delivery_effect_domain_lock
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
