-- The triggers effects keeps on effects_remoteeffect (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_remoteeffect_immutable_columns ON effects_remoteeffect;
CREATE TRIGGER effects_remoteeffect_immutable_columns BEFORE UPDATE ON effects_remoteeffect
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'lease_holder', 'lease_expires_at',
    'lease_fence', 'attempt_count', 'remote_id', 'quarantine_reason', 'changed_at', 'next_attempt_at');

DROP TRIGGER IF EXISTS effects_remoteeffect_transition ON effects_remoteeffect;
CREATE TRIGGER effects_remoteeffect_transition BEFORE UPDATE ON effects_remoteeffect
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'prepared>dispatching',
    'prepared>quarantined', 'dispatching>remote_confirmed', 'dispatching>uncertain', 'dispatching>no_effect',
    'dispatching>prepared', 'uncertain>remote_confirmed', 'uncertain>no_effect', 'uncertain>quarantined',
    'uncertain>prepared', 'remote_confirmed>finalized');
