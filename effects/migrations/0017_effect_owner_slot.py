"""Issue 37 item 7 (D-441): the pushes of one owner slot are sent one at a time in authored order. Each RemoteEffect
carries its command's owner slot (immutable: `effects_remoteeffect_immutable_columns` does not list it), and a
partial index holds the open (non-terminal) effects of each slot, so the claim's "no earlier open effect of this
slot" probe is one index lookup. The effects open at migration time get their command's slot (the immutability
trigger is disabled for this one statement only, in the migration's transaction); terminal effects keep ''."""
from django.db import migrations, models

BACKFILL = """
ALTER TABLE effects_remoteeffect DISABLE TRIGGER effects_remoteeffect_immutable_columns;
UPDATE effects_remoteeffect e SET owner_slot = c.owner_slot
  FROM effects_outboundcommand c
 WHERE c.id = e.command_id AND c.owner_slot <> ''
   AND e.state IN ('prepared', 'dispatching', 'uncertain', 'remote_confirmed');
ALTER TABLE effects_remoteeffect ENABLE TRIGGER effects_remoteeffect_immutable_columns;
"""


class Migration(migrations.Migration):
    dependencies = [("effects", "0016_halt_drain_notify")]

    operations = [
        migrations.AddField(
            model_name="remoteeffect",
            name="owner_slot",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop, hints={"target_db": "default"}),
        migrations.AddIndex(
            model_name="remoteeffect",
            index=models.Index(condition=models.Q(("state__in", ["prepared", "dispatching", "uncertain",
                                                                 "remote_confirmed"]),
                                                  models.Q(("owner_slot", ""), _negated=True)),
                               fields=["account", "owner_slot", "id"], name="effects_effect_slot_open"),
        ),
    ]
