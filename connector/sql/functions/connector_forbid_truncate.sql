-- A statement-level guard: TRUNCATE bypasses row triggers, so append-only and immutable
-- tables refuse it too (`<table>_no_truncate`).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_forbid_truncate()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  RAISE EXCEPTION 'append-only: % is never truncated', TG_TABLE_NAME
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_no_truncate';
END $$;
