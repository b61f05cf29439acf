-- The triggers effects keeps on effects_remotejobsemaphore (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remotejobsemaphore_immutable_columns ON effects_remotejobsemaphore;
CREATE TRIGGER effects_remotejobsemaphore_immutable_columns BEFORE UPDATE ON effects_remotejobsemaphore
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('capacity');
