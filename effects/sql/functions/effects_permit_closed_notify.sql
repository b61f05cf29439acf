-- The transaction that closes a permit of a `halting_v2` gate NOTIFYs the gate's pk on
-- connector.hooks.HALT_DRAIN_CHANNEL at its commit, so a halt confirmer waiting on it tries `confirm_halted` at
-- once. The notification is a hint: `confirm_halted` re-reads the open permits under the gate's lock.
CREATE OR REPLACE FUNCTION effects_permit_closed_notify()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
    -- READ COMMITTED: this statement sees every gate transition committed before it ran.
    IF EXISTS (SELECT 1 FROM connector_accountservinggate WHERE id = NEW.gate_id AND mode = 'halting_v2') THEN
        -- ':clear' when no open permit of the gate is visible to this statement (it sees its own closings, not
        -- another transaction's uncommitted ones): a hint that lets the waiter skip its read (D-384).
        PERFORM pg_notify('connector_halt_drain', NEW.gate_id::text || CASE WHEN EXISTS (
            SELECT 1 FROM effects_dispatchpermit WHERE gate_id = NEW.gate_id AND state IN ('granted', 'sending'))
            THEN '' ELSE ':clear' END);
    END IF;
    RETURN NULL;
END $$;
