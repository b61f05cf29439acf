-- TG_ARGV[0] names a numeric column that may only grow (a lane high-water never moves back).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_never_decreases()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF (to_jsonb(OLD) ->> TG_ARGV[0]) IS NOT NULL AND ((to_jsonb(NEW) ->> TG_ARGV[0]) IS NULL
      OR (to_jsonb(NEW) ->> TG_ARGV[0])::numeric < (to_jsonb(OLD) ->> TG_ARGV[0])::numeric) THEN
    RAISE EXCEPTION '%.% never decreases', TG_TABLE_NAME, TG_ARGV[0]
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_monotonic';
  END IF;
  RETURN NEW;
END $$;
