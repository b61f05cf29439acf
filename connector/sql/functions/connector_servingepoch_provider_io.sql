-- `provider_io_held` is set only by an epoch's first activation (verified -> active), in the same
-- UPDATE; once cleared by the exact readback it is never held again.
CREATE OR REPLACE FUNCTION connector_servingepoch_provider_io()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.provider_io_held AND NOT OLD.provider_io_held
     AND NOT (OLD.state = 'verified' AND NEW.state = 'active') THEN
    RAISE EXCEPTION 'provider I/O of epoch % may be held only by its first activation (verified -> active)',
      OLD.epoch_id USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_provider_io_held';
  END IF;
  RETURN NEW;
END $$;
