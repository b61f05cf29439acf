-- The triggers cutover keeps on v1_v1outboundeffect (the functions they call are in */sql/functions/).
-- optional: the V1 table removal (cutover/services/v1_removal.py) drops this table after the cutover

DROP TRIGGER IF EXISTS cutover_v1_retired ON v1_v1outboundeffect;
CREATE TRIGGER cutover_v1_retired BEFORE INSERT OR DELETE OR UPDATE OR TRUNCATE ON v1_v1outboundeffect
  FOR EACH STATEMENT EXECUTE FUNCTION cutover_v1_retired();
