-- The serving guard's locks in one round trip (connector/services/guard.py): read which epoch the gate
-- names; lock that epoch FOR SHARE; take the gate's fair advisory lock shared (the key 1129722371 is
-- connector.locks.ADVISORY_LOCK_KEYS["account_gate"]); lock the gate FOR SHARE; re-check that the gate still
-- names the locked epoch. Each attempt runs in a subtransaction, so an attempt that lost the race to an
-- activation releases both row locks and the advisory lock before it starts again: epoch before gate, always
-- (docs/locking.md). When the gate names no epoch it first waits for a transaction holding the gate FOR UPDATE.
-- Returns `outcome` ('locked', 'no_epoch', 'moved'), the gate's (pk, mode, fence, epoch pk, epoch digest) and the
-- epoch's (epoch_id, state, digest, provider_io_held), never its preimage. The checks stay in Python.
-- SECURITY INVOKER: the application role already reads and locks both tables.
CREATE OR REPLACE FUNCTION connector_lock_serving(p_account bigint, p_attempts integer, OUT outcome text,
    OUT gate_pk bigint, OUT gate_mode text, OUT gate_fence bigint, OUT gate_epoch_pk bigint,
    OUT gate_epoch_digest bytea, OUT epoch_ref text, OUT epoch_state text, OUT epoch_digest bytea,
    OUT epoch_io_held boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $$
DECLARE
  v_named bigint;
  v_attempt integer := 0;
BEGIN
  LOOP
    v_attempt := v_attempt + 1;
    SELECT g.epoch_id INTO v_named FROM connector_accountservinggate g WHERE g.account_id = p_account;
    IF v_named IS NULL THEN
      -- An activation may be committing right now: wait for the gate row without keeping a lock, then look again.
      BEGIN
        PERFORM 1 FROM connector_accountservinggate g WHERE g.account_id = p_account FOR SHARE;
        RAISE SQLSTATE 'CNW01';
      EXCEPTION WHEN SQLSTATE 'CNW01' THEN NULL;
      END;
      SELECT g.epoch_id, g.mode INTO v_named, gate_mode
        FROM connector_accountservinggate g WHERE g.account_id = p_account;
      IF v_named IS NULL THEN
        outcome := 'no_epoch';
        RETURN;
      END IF;
      gate_mode := NULL;
    END IF;
    BEGIN
      SELECT e.epoch_id, e.state, e.digest, e.provider_io_held
        INTO epoch_ref, epoch_state, epoch_digest, epoch_io_held
        FROM connector_servingepoch e WHERE e.id = v_named FOR SHARE;
      PERFORM pg_advisory_xact_lock_shared(1129722371, (p_account % 2147483647)::integer);
      SELECT g.id, g.mode, g.fence, g.epoch_id, g.epoch_digest
        INTO gate_pk, gate_mode, gate_fence, gate_epoch_pk, gate_epoch_digest
        FROM connector_accountservinggate g WHERE g.account_id = p_account FOR SHARE;
      IF gate_epoch_pk IS DISTINCT FROM v_named OR epoch_ref IS NULL THEN
        RAISE SQLSTATE 'CNW02';  -- lost the race: release both share locks and the advisory lock
      END IF;
      outcome := 'locked';
      RETURN;
    EXCEPTION WHEN SQLSTATE 'CNW02' THEN
      gate_pk := NULL; gate_mode := NULL; gate_fence := NULL; gate_epoch_pk := NULL; gate_epoch_digest := NULL;
      epoch_ref := NULL; epoch_state := NULL; epoch_digest := NULL; epoch_io_held := NULL;
      IF v_attempt >= p_attempts THEN
        outcome := 'moved';
        RETURN;
      END IF;
    END;
  END LOOP;
END
$$;
