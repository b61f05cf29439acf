-- The triggers v1 keeps on v1_v1processgeneration (the functions they call are in */sql/functions/).
-- optional: the V1 table removal (cutover/services/v1_removal.py) drops this table after the cutover

DROP TRIGGER IF EXISTS v1_v1processgeneration_egress ON v1_v1processgeneration;
CREATE TRIGGER v1_v1processgeneration_egress BEFORE UPDATE ON v1_v1processgeneration
  FOR EACH ROW EXECUTE FUNCTION v1_egress_never_reopens();

DROP TRIGGER IF EXISTS v1_v1processgeneration_immutable_columns ON v1_v1processgeneration;
CREATE TRIGGER v1_v1processgeneration_immutable_columns BEFORE UPDATE ON v1_v1processgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'egress_isolated', 'terminated_at');

DROP TRIGGER IF EXISTS v1_v1processgeneration_transition ON v1_v1processgeneration;
CREATE TRIGGER v1_v1processgeneration_transition BEFORE UPDATE ON v1_v1processgeneration
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'running>terminated');
