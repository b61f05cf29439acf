-- While a succession drain of epoch E is `draining` or `drained`, a new Receipt bound to E, or a new
-- OutboundCommand bound to E that no Execution authored, is refused (`cutover_succession_roots_closed`). The
-- trigger first takes the epoch's roots lock shared (advisory key 1129722374, cutover.locks.SUCCESSION_ROOTS_LOCK_KEY):
-- the drain takes it exclusive, so a root crossing the barrier when the drain opens is in its inventory.
CREATE OR REPLACE FUNCTION cutover_succession_roots_closed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF TG_ARGV[0] = 'outbound' THEN
    IF NEW.source_execution_id IS NOT NULL THEN
      RETURN NEW;  -- continuation: authored by an Execution of already admitted work
    END IF;
  END IF;
  PERFORM pg_advisory_xact_lock_shared(1129722374, (NEW.epoch_id % 2147483647)::integer);
  IF EXISTS (SELECT 1 FROM cutover_successiondrain WHERE predecessor_epoch_id = NEW.epoch_id
              AND state IN ('draining', 'drained')) THEN
    RAISE EXCEPTION 'epoch % is draining for a successor activation: new roots are refused (% insert refused)',
      NEW.epoch_id, TG_TABLE_NAME USING ERRCODE = '23514', CONSTRAINT = 'cutover_succession_roots_closed';
  END IF;
  RETURN NEW;
END $$;
