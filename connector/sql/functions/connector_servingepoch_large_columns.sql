-- ServingEpoch's two large columns (preimage, configuration_receipt) never change; the trigger fires
-- only when an UPDATE names one of them (BEFORE UPDATE OF), so state transitions do not compare them.
CREATE OR REPLACE FUNCTION connector_servingepoch_large_columns()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.preimage IS DISTINCT FROM OLD.preimage
     OR NEW.configuration_receipt IS DISTINCT FROM OLD.configuration_receipt THEN
    RAISE EXCEPTION 'immutable columns of connector_servingepoch changed (only state, state_changed_at, '
      'rejection_code, rejection_detail may change)'
      USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_immutable_columns';
  END IF;
  RETURN NEW;
END $$;
