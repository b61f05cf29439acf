-- Only the columns named in TG_ARGV may change (`<table>_immutable_columns`).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_only_columns_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF (to_jsonb(NEW) - TG_ARGV) IS DISTINCT FROM (to_jsonb(OLD) - TG_ARGV) THEN
    RAISE EXCEPTION 'immutable columns of % changed (only % may change)', TG_TABLE_NAME, TG_ARGV
      USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_immutable_columns';
  END IF;
  RETURN NEW;
END $$;
