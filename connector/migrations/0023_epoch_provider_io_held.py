"""Provider I/O held until the exact activation readback (issue 22; CV2-12-071, D-321).

1. `ServingEpoch.provider_io_held`: set by a service cutover's first activation transaction together with
   `verified -> active`, cleared only by its exact readback's transaction. A trigger refuses setting it on any other
   UPDATE (once cleared, never held again) and on an epoch that is not becoming active.
2. `connector_lock_serving` (migration 0012) also returns the locked epoch's `provider_io_held` (a last OUT column,
   `epoch_io_held`): the permit acquisition checks it on the epoch row its guard already holds FOR SHARE, in the
   same one statement (no round trip is added). The readback clears it under the epoch FOR UPDATE, so an
   acquisition and the readback serialize. The function's other columns, order and locks are unchanged;
   `connector_receipt_admit` names the columns it reads, so it is untouched.
"""
import importlib

from django.db import migrations, models

M0012 = importlib.import_module("connector.migrations.0012_serving_guard_function")

NEW_FUNCTION = (M0012.CREATE_SQL
                .replace("OUT epoch_ref text, OUT epoch_state text, OUT epoch_digest bytea)",
                         "OUT epoch_ref text, OUT epoch_state text, OUT epoch_digest bytea, OUT epoch_io_held boolean)")
                .replace("SELECT e.epoch_id, e.state, e.digest INTO epoch_ref, epoch_state, epoch_digest",
                         "SELECT e.epoch_id, e.state, e.digest, e.provider_io_held\n"
                         "        INTO epoch_ref, epoch_state, epoch_digest, epoch_io_held")
                .replace("epoch_ref := NULL; epoch_state := NULL; epoch_digest := NULL;",
                         "epoch_ref := NULL; epoch_state := NULL; epoch_digest := NULL; epoch_io_held := NULL;"))
assert NEW_FUNCTION.count("epoch_io_held") == 3, "migration 0012's function text changed"

HELD_RULE = """
CREATE OR REPLACE FUNCTION connector_servingepoch_provider_io() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.provider_io_held AND NOT OLD.provider_io_held
     AND NOT (OLD.state = 'verified' AND NEW.state = 'active') THEN
    RAISE EXCEPTION 'provider I/O of epoch % may be held only by its first activation (verified -> active)',
      OLD.epoch_id USING ERRCODE = '23000', CONSTRAINT = 'connector_servingepoch_provider_io_held';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER connector_servingepoch_provider_io BEFORE UPDATE OF provider_io_held ON connector_servingepoch
  FOR EACH ROW EXECUTE FUNCTION connector_servingepoch_provider_io();
"""
DROP_HELD_RULE = """
DROP TRIGGER IF EXISTS connector_servingepoch_provider_io ON connector_servingepoch;
DROP FUNCTION IF EXISTS connector_servingepoch_provider_io();
"""


class Migration(migrations.Migration):
    dependencies = [("connector", "0022_h7_v1_predecessor_ref")]

    operations = [
        migrations.AddField(
            model_name="servingepoch",
            name="provider_io_held",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.RunSQL(HELD_RULE, DROP_HELD_RULE, hints={"target_db": "default"}),
        migrations.RunSQL([M0012.DROP_SQL, NEW_FUNCTION], [M0012.DROP_SQL, M0012.CREATE_SQL],
                          hints={"target_db": "default"}),
    ]
