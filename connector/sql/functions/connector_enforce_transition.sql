-- TG_ARGV[0] is the state column; the rest are the allowed 'from>to' edges, the model's
-- transition table in choices.py (`<table>_transition`; tests/test_sql_files.py compares them).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_enforce_transition()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
  old_s text := to_jsonb(OLD) ->> TG_ARGV[0];
  new_s text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
  IF old_s IS NOT DISTINCT FROM new_s THEN
    RETURN NEW;
  END IF;
  FOR i IN 1 .. array_length(TG_ARGV, 1) - 1 LOOP
    IF TG_ARGV[i] = old_s || '>' || new_s THEN
      RETURN NEW;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'transition % -> % is not allowed on %', old_s, new_s, TG_TABLE_NAME
    USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_transition';
END $$;
