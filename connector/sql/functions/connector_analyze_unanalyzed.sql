-- The first planner statistics of a table that has never had any (issue 40 goal 3, D-542): every table of the
-- schema with no ANALYZE yet, manual or autovacuum's, and at least `min_rows` rows changed is analyzed now, and its
-- name returned. Autovacuum first analyzes a new table up to a minute (its naptime) after it passed its threshold;
-- until then the hot path's plans are chosen on no statistics at all. SECURITY DEFINER: ANALYZE needs the table's
-- owner, and the statistics sweep runs as the application role; the function analyzes, it writes no row. Catalog
-- names are qualified, so a temporary object of the caller cannot stand in for them.
CREATE OR REPLACE FUNCTION connector_analyze_unanalyzed(min_rows bigint)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $$
DECLARE
  t text;
BEGIN
  FOR t IN
    SELECT s.relname FROM pg_catalog.pg_stat_user_tables s
     WHERE s.schemaname = current_schema() AND s.last_analyze IS NULL AND s.last_autoanalyze IS NULL
       AND s.n_mod_since_analyze >= min_rows
     ORDER BY s.relname
  LOOP
    EXECUTE pg_catalog.format('ANALYZE %I.%I', current_schema(), t);
    RETURN NEXT t;
  END LOOP;
END $$;
