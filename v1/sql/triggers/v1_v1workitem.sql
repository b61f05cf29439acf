-- The triggers v1 keeps on v1_v1workitem (the functions they call are in */sql/functions/).
-- optional: the V1 table removal (cutover/services/v1_removal.py) drops this table after the cutover

DROP TRIGGER IF EXISTS v1_v1workitem_immutable_columns ON v1_v1workitem;
CREATE TRIGGER v1_v1workitem_immutable_columns BEFORE UPDATE ON v1_v1workitem
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'lease_generation', 'lease_until');

DROP TRIGGER IF EXISTS v1_v1workitem_transition ON v1_v1workitem;
CREATE TRIGGER v1_v1workitem_transition BEFORE UPDATE ON v1_v1workitem
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'accepted>claimed', 'claimed>done',
    'claimed>accepted')
;
