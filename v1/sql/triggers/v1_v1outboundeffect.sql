-- The triggers v1 keeps on v1_v1outboundeffect (the functions they call are in */sql/functions/).
-- optional: the V1 table removal (cutover/services/v1_removal.py) drops this table after the cutover

DROP TRIGGER IF EXISTS v1_v1outboundeffect_immutable_columns ON v1_v1outboundeffect;
CREATE TRIGGER v1_v1outboundeffect_immutable_columns BEFORE UPDATE ON v1_v1outboundeffect
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'dispatch_generation', 'remote_id',
    'evidence', 'changed_at');

DROP TRIGGER IF EXISTS v1_v1outboundeffect_transition ON v1_v1outboundeffect;
CREATE TRIGGER v1_v1outboundeffect_transition BEFORE UPDATE ON v1_v1outboundeffect
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'intent>dispatching',
    'dispatching>finalized', 'dispatching>no_effect', 'dispatching>ambiguous', 'ambiguous>finalized',
    'ambiguous>no_effect');
