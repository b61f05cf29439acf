-- The triggers effects keeps on effects_certificationapproval (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_certificationapproval_append_only ON effects_certificationapproval;
CREATE TRIGGER effects_certificationapproval_append_only BEFORE DELETE OR UPDATE ON effects_certificationapproval
  FOR EACH ROW EXECUTE FUNCTION connector_forbid_update_delete();

DROP TRIGGER IF EXISTS effects_certificationapproval_no_truncate ON effects_certificationapproval;
CREATE TRIGGER effects_certificationapproval_no_truncate BEFORE TRUNCATE ON effects_certificationapproval
  FOR EACH STATEMENT EXECUTE FUNCTION connector_forbid_truncate();
