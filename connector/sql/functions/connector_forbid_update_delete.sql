-- An append-only table: a row is never updated nor deleted (`<table>_append_only`).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_forbid_update_delete()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  RAISE EXCEPTION 'append-only: % rows are never % d', TG_TABLE_NAME, lower(TG_OP)
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_append_only';
END $$;
