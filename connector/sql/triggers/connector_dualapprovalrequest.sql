-- The triggers connector keeps on connector_dualapprovalrequest (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS connector_dualapprovalrequest_immutable_columns ON connector_dualapprovalrequest;
CREATE TRIGGER connector_dualapprovalrequest_immutable_columns BEFORE UPDATE ON connector_dualapprovalrequest
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'void_reason', 'changed_at',
    'refused_by_id', 'refusal_reason');

DROP TRIGGER IF EXISTS connector_dualapprovalrequest_transition ON connector_dualapprovalrequest;
CREATE TRIGGER connector_dualapprovalrequest_transition BEFORE UPDATE ON connector_dualapprovalrequest
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'pending>approved', 'pending>voided',
    'approved>voided', 'pending>refused');
