-- ServingEpoch's immutable columns compared by name and its transition edges on `state` alone, without
-- to_jsonb (which would detoast and rewrite the preimage on every transition). The edges are
-- connector.choices.EPOCH_TRANSITIONS (tests/test_sql_files.py compares them).
CREATE OR REPLACE FUNCTION connector_servingepoch_rules()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.id IS DISTINCT FROM OLD.id OR NEW.epoch_id IS DISTINCT FROM OLD.epoch_id
     OR NEW.profile_id IS DISTINCT FROM OLD.profile_id
     OR NEW.serving_scope_digest IS DISTINCT FROM OLD.serving_scope_digest
     OR NEW.catalog_view_id IS DISTINCT FROM OLD.catalog_view_id
     OR NEW.configuration_id IS DISTINCT FROM OLD.configuration_id
     OR NEW.configuration_receipt_digest IS DISTINCT FROM OLD.configuration_receipt_digest
     OR NEW.digest IS DISTINCT FROM OLD.digest OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
    RAISE EXCEPTION 'immutable columns of connector_servingepoch changed (only state, state_changed_at, '
      'rejection_code, rejection_detail may change)'
      USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_immutable_columns';
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state AND NOT (OLD.state || '>' || NEW.state = ANY (ARRAY['prepared>verified', 'prepared>rejected', 'verified>active', 'verified>rejected', 'active>draining', 'draining>retired'])) THEN
    RAISE EXCEPTION 'transition % -> % is not allowed on connector_servingepoch', OLD.state, NEW.state
      USING ERRCODE = '23514', CONSTRAINT = 'connector_servingepoch_transition';
  END IF;
  RETURN NEW;
END $$;
