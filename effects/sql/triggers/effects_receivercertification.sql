-- The triggers effects keeps on effects_receivercertification (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_receivercertification_immutable_columns ON effects_receivercertification;
CREATE TRIGGER effects_receivercertification_immutable_columns BEFORE UPDATE ON effects_receivercertification
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'certified_at', 'refused_by_id',
    'refusal_reason');

DROP TRIGGER IF EXISTS effects_receivercertification_transition ON effects_receivercertification;
CREATE TRIGGER effects_receivercertification_transition BEFORE UPDATE ON effects_receivercertification
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'pending_approval>certified',
    'pending_approval>expired', 'certified>expired', 'pending_approval>refused');
