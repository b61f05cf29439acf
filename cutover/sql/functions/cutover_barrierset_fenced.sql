-- A publication barrier set changes only by a listed transition advancing the fence by one, or by the
-- holder takeover: on an open set the holder changes to another non-empty identity, the fence advances by one and
-- nothing else changes.
CREATE OR REPLACE FUNCTION cutover_barrierset_fenced()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.holder IS DISTINCT FROM OLD.holder AND (
       NEW.state IS DISTINCT FROM OLD.state OR OLD.state = 'released' OR NEW.holder = ''
       OR (to_jsonb(NEW) - ARRAY['holder', 'fence', 'changed_at'])
          IS DISTINCT FROM (to_jsonb(OLD) - ARRAY['holder', 'fence', 'changed_at'])) THEN
    RAISE EXCEPTION 'a holder takeover changes only the holder and the fence of an open set (% -> %)',
      OLD.state, NEW.state USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_takeover';
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state OR NEW.holder IS DISTINCT FROM OLD.holder THEN
    IF NEW.fence <> OLD.fence + 1 THEN
      RAISE EXCEPTION 'fence of % must advance by exactly one on a transition or takeover (% -> %)',
        TG_TABLE_NAME, OLD.fence, NEW.fence USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
    END IF;
  ELSIF (to_jsonb(NEW) - 'changed_at') IS DISTINCT FROM (to_jsonb(OLD) - 'changed_at') THEN
    RAISE EXCEPTION '% changes only through a fenced transition or takeover', TG_TABLE_NAME
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
  END IF;
  RETURN NEW;
END $$;
