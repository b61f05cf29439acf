"""Issue 20, goal 5 (D-380): the transaction that closes a permit of a `halting_v2` gate NOTIFYs the gate's pk on
`connector.hooks.HALT_DRAIN_CHANNEL` at its commit, so a confirmer waiting on that channel
(`connector.services.halt_wait.wait_halted`) tries `confirm_halted` as soon as the last open permit settled
instead of polling. Only then: a permit of a gate in any other mode notifies nothing (a NOTIFY serializes its
transaction's commit with every other notifying commit). The notification is a hint; `confirm_halted` re-reads
the open-permit set under the gate's FOR UPDATE, and a lost notification only leaves the waiter to its poll."""
from django.db import migrations

from connector.hooks import HALT_DRAIN_CHANNEL

CREATE = f"""
CREATE FUNCTION effects_permit_closed_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- READ COMMITTED: this statement sees every gate transition committed before it ran.
    IF EXISTS (SELECT 1 FROM connector_accountservinggate WHERE id = NEW.gate_id AND mode = 'halting_v2') THEN
        -- ':clear' when no open permit of the gate is visible to this statement (it sees its own closings, not
        -- another transaction's uncommitted ones): a hint that lets the waiter skip its read (D-384).
        PERFORM pg_notify('{HALT_DRAIN_CHANNEL}', NEW.gate_id::text || CASE WHEN EXISTS (
            SELECT 1 FROM effects_dispatchpermit WHERE gate_id = NEW.gate_id AND state IN ('granted', 'sending'))
            THEN '' ELSE ':clear' END);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER effects_dispatchpermit_closed_notify AFTER UPDATE OF state ON effects_dispatchpermit
    FOR EACH ROW WHEN (OLD.state IN ('granted', 'sending') AND NEW.state IN ('returned', 'abandoned'))
    EXECUTE FUNCTION effects_permit_closed_notify();
"""
DROP = """
DROP TRIGGER IF EXISTS effects_dispatchpermit_closed_notify ON effects_dispatchpermit;
DROP FUNCTION IF EXISTS effects_permit_closed_notify();
"""


class Migration(migrations.Migration):
    dependencies = [("effects", "0015_remote_call_intents")]

    operations = [migrations.RunSQL(CREATE, DROP, hints={"target_db": "default"})]
