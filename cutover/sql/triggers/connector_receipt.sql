-- The triggers cutover keeps on connector_receipt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_succession_roots_closed ON connector_receipt;
CREATE TRIGGER cutover_succession_roots_closed BEFORE INSERT ON connector_receipt
  FOR EACH ROW EXECUTE FUNCTION cutover_succession_roots_closed('receipt');
