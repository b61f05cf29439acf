-- The triggers effects keeps on effects_reconciliationcampaign (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_reconciliationcampaign_immutable_columns ON effects_reconciliationcampaign;
CREATE TRIGGER effects_reconciliationcampaign_immutable_columns BEFORE UPDATE ON effects_reconciliationcampaign
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('findings', 'completed_at');
