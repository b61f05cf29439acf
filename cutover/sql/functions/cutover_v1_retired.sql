-- V1 retired at the first V2 commit: once a service cutover attempt is `v2_committed`, every V1
-- operational table refuses INSERT, UPDATE, DELETE and TRUNCATE (`cutover_v1_retired`), whatever role writes.
CREATE OR REPLACE FUNCTION cutover_v1_retired()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
DECLARE
  v_attempt text;
BEGIN
  SELECT attempt_key INTO v_attempt FROM cutover_servicecutoverattempt WHERE outcome = 'v2_committed'
   ORDER BY id LIMIT 1;
  IF v_attempt IS NOT NULL THEN
    RAISE EXCEPTION 'V1 is retired: service cutover % committed V2, so % is terminal read-only (% refused)',
      v_attempt, TG_TABLE_NAME, TG_OP
      USING ERRCODE = '23000', CONSTRAINT = 'cutover_v1_retired';
  END IF;
  RETURN NULL;
END $$;
