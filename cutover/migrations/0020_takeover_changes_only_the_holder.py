"""A barrier set's one non-transition edge, the holder takeover (D-133, CV2-11-049/056), for a V2 -> V2 successor
set as for a first-activation set: on an open set (`acquiring`, `held`, `activation_committed`) the holder changes
to another non-empty identity, the fence advances by exactly one, and NOTHING else changes (no state, owner
receipts digest or release reason rides along). Replaces the function of 0015, which let other open columns change
in the same UPDATE. Every other change is still a listed transition (0004) advancing the fence by one."""
from django.db import migrations

TABLE = "cutover_servingpublicationbarrierset"
FENCED = """
CREATE OR REPLACE FUNCTION cutover_barrierset_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.holder IS DISTINCT FROM OLD.holder AND (
       NEW.state IS DISTINCT FROM OLD.state OR OLD.state = 'released' OR NEW.holder = ''
       OR (to_jsonb(NEW) - ARRAY['holder', 'fence', 'changed_at'])
          IS DISTINCT FROM (to_jsonb(OLD) - ARRAY['holder', 'fence', 'changed_at'])) THEN
    RAISE EXCEPTION 'a holder takeover changes only the holder and the fence of an open set (% -> %)',
      OLD.state, NEW.state USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_takeover';
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state OR NEW.holder IS DISTINCT FROM OLD.holder THEN
    IF NEW.fence <> OLD.fence + 1 THEN
      RAISE EXCEPTION 'fence of % must advance by exactly one on a transition or takeover (% -> %)',
        TG_TABLE_NAME, OLD.fence, NEW.fence USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
    END IF;
  ELSIF (to_jsonb(NEW) - 'changed_at') IS DISTINCT FROM (to_jsonb(OLD) - 'changed_at') THEN
    RAISE EXCEPTION '% changes only through a fenced transition or takeover', TG_TABLE_NAME
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
  END IF;
  RETURN NEW;
END $$;
"""
FENCED_0015 = """
CREATE OR REPLACE FUNCTION cutover_barrierset_fenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.holder IS DISTINCT FROM OLD.holder AND (NEW.state IS DISTINCT FROM OLD.state OR OLD.state = 'released'
                                                 OR NEW.holder = '') THEN
    RAISE EXCEPTION 'a holder takeover keeps the state of an open set (% -> %)', OLD.state, NEW.state
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_takeover';
  END IF;
  IF NEW.state IS DISTINCT FROM OLD.state OR NEW.holder IS DISTINCT FROM OLD.holder THEN
    IF NEW.fence <> OLD.fence + 1 THEN
      RAISE EXCEPTION 'fence of % must advance by exactly one on a transition or takeover (% -> %)',
        TG_TABLE_NAME, OLD.fence, NEW.fence USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
    END IF;
  ELSIF (to_jsonb(NEW) - 'changed_at') IS DISTINCT FROM (to_jsonb(OLD) - 'changed_at') THEN
    RAISE EXCEPTION '% changes only through a fenced transition or takeover', TG_TABLE_NAME
      USING ERRCODE = '23514', CONSTRAINT = TG_TABLE_NAME || '_fence_advance';
  END IF;
  RETURN NEW;
END $$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("cutover", "0019_v1_table_removal_db_rules"),
    ]

    operations = [migrations.RunSQL(FENCED, FENCED_0015, hints={"target_db": "default"})]
