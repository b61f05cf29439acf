-- Once TG_ARGV[0] holds a non-empty value the row is settled evidence: nothing of it changes any more.
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_settled_once()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF coalesce(to_jsonb(OLD) ->> TG_ARGV[0], '') <> '' AND to_jsonb(NEW) IS DISTINCT FROM to_jsonb(OLD) THEN
    RAISE EXCEPTION '% is settled evidence (% = %): it is never rewritten', TG_TABLE_NAME, TG_ARGV[0],
      to_jsonb(OLD) ->> TG_ARGV[0] USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_settled_once';
  END IF;
  RETURN NEW;
END $$;
