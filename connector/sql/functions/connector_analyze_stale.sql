-- Planner statistics that do not wait for autovacuum (issue 40 goal 3, D-542, D-544): every table of the schema
-- with at least `min_rows` rows changed since its last ANALYZE and either no statistics at all or statistics taken
-- when it held fewer rows than have changed since (a table analyzed nearly empty, then grown) is analyzed now, and
-- its name returned. Autovacuum analyzes up to a minute (its naptime) after a table passed its threshold; until
-- then the hot path's plans are chosen on no statistics, or on those of a table a fraction of its size. A table
-- whose statistics are current costs nothing; a large table qualifies only after as many changes as it has rows,
-- far less often than autovacuum's 10 %. SECURITY DEFINER: ANALYZE needs the table's owner, and the statistics
-- sweep runs as the application role; the function analyzes, it writes no row. Catalog names are qualified, so a
-- temporary object of the caller cannot stand in for them.
CREATE OR REPLACE FUNCTION connector_analyze_stale(min_rows bigint)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SECURITY DEFINER
AS $$
DECLARE
  t text;
BEGIN
  FOR t IN
    SELECT s.relname FROM pg_catalog.pg_stat_user_tables s
      JOIN pg_catalog.pg_class c ON c.oid = s.relid
     WHERE s.schemaname = current_schema() AND s.n_mod_since_analyze >= min_rows
       AND ((s.last_analyze IS NULL AND s.last_autoanalyze IS NULL)
            OR s.n_mod_since_analyze > GREATEST(c.reltuples, 0))
     ORDER BY s.relname
  LOOP
    EXECUTE pg_catalog.format('ANALYZE %I.%I', current_schema(), t);
    RETURN NEXT t;
  END LOOP;
END $$;
