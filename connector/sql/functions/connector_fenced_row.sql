-- A fenced row changes only by a transition, and every transition advances `fence` by exactly one.
-- TG_ARGV[0] is the state column, TG_ARGV[1] the auto-updated timestamp column (`<table>_fence_advance`).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_fenced_row()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF (to_jsonb(NEW) ->> TG_ARGV[0]) IS DISTINCT FROM (to_jsonb(OLD) ->> TG_ARGV[0]) THEN
    IF NEW.fence <> OLD.fence + 1 THEN
      RAISE EXCEPTION 'fence of % must advance by exactly one on a transition (% -> %)',
        TG_TABLE_NAME, OLD.fence, NEW.fence
        USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
    END IF;
  ELSIF (to_jsonb(NEW) - TG_ARGV[1]) IS DISTINCT FROM (to_jsonb(OLD) - TG_ARGV[1]) THEN
    RAISE EXCEPTION '% changes only through a fenced transition', TG_TABLE_NAME
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
  END IF;
  RETURN NEW;
END $$;
