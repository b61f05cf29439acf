-- The triggers effects keeps on effects_remoteeffectattempt (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remoteeffectattempt_immutable_columns ON effects_remoteeffectattempt;
CREATE TRIGGER effects_remoteeffectattempt_immutable_columns BEFORE UPDATE ON effects_remoteeffectattempt
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('outcome', 'response_status', 'response_digest',
    'evidence', 'settled_at');

DROP TRIGGER IF EXISTS effects_remoteeffectattempt_settled_once ON effects_remoteeffectattempt;
CREATE TRIGGER effects_remoteeffectattempt_settled_once BEFORE UPDATE ON effects_remoteeffectattempt
  FOR EACH ROW EXECUTE FUNCTION connector_settled_once('outcome');

DROP TRIGGER IF EXISTS effects_remoteeffectattempt_transition ON effects_remoteeffectattempt;
CREATE TRIGGER effects_remoteeffectattempt_transition BEFORE UPDATE ON effects_remoteeffectattempt
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('outcome', '>remote_confirmed', '>uncertain',
    '>no_effect');
