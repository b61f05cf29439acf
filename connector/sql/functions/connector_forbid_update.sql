-- An immutable table: a row is never updated (its `<table>_immutable` trigger).
-- databases: default journal
CREATE OR REPLACE FUNCTION connector_forbid_update()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  RAISE EXCEPTION 'immutable fact: % rows are never updated', TG_TABLE_NAME
    USING ERRCODE = '23000', CONSTRAINT = TG_TABLE_NAME || '_immutable';
END $$;
