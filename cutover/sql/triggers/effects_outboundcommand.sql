-- The triggers cutover keeps on effects_outboundcommand (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS cutover_succession_roots_closed ON effects_outboundcommand;
CREATE TRIGGER cutover_succession_roots_closed BEFORE INSERT ON effects_outboundcommand
  FOR EACH ROW EXECUTE FUNCTION cutover_succession_roots_closed('outbound');
