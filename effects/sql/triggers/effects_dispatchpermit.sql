-- The triggers effects keeps on effects_dispatchpermit (the functions they call are in */sql/functions/).

DROP TRIGGER IF EXISTS effects_dispatchpermit_closed_notify ON effects_dispatchpermit;
CREATE TRIGGER effects_dispatchpermit_closed_notify AFTER UPDATE OF state ON effects_dispatchpermit
  FOR EACH ROW WHEN ((((old.state)::text = ANY (ARRAY[('granted'::character varying)::text,
    ('sending'::character varying)::text])) AND ((new.state)::text = ANY (ARRAY[('returned'::character varying)::text,
    ('abandoned'::character varying)::text])))) EXECUTE FUNCTION effects_permit_closed_notify();

DROP TRIGGER IF EXISTS effects_dispatchpermit_immutable_columns ON effects_dispatchpermit;
CREATE TRIGGER effects_dispatchpermit_immutable_columns BEFORE UPDATE ON effects_dispatchpermit
  FOR EACH ROW EXECUTE FUNCTION connector_only_columns_change('state', 'io_may_have_started', 'sending_at',
    'closed_at', 'abandonment_proof');

DROP TRIGGER IF EXISTS effects_dispatchpermit_transition ON effects_dispatchpermit;
CREATE TRIGGER effects_dispatchpermit_transition BEFORE UPDATE ON effects_dispatchpermit
  FOR EACH ROW EXECUTE FUNCTION connector_enforce_transition('state', 'granted>sending', 'granted>abandoned',
    'sending>returned', 'sending>abandoned');
