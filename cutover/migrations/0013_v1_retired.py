"""V1 retired at the first V2 commit (issue 22; CV2-12-069, CV2-12-077, D-292): once a service cutover attempt is
`v2_committed`, every V1 operational table is terminal read-only. A statement-level trigger on each refuses any
INSERT, UPDATE, DELETE or TRUNCATE with constraint `cutover_v1_retired`, whatever role or path writes: a new V1
process generation, a barrier reopened, a work item, effect, cursor or high-water touched. Before that commit V1
is recoverable authority and writes as before (the restore replaces `default` from a dump taken before any V2
commit, so the trigger never fires there). The tables stay as read-only evidence (tombstones, ordering
baselines, replay predecessor evidence and audit retention may still read them); dropping them is not done here.

Statement-level: one EXISTS per statement, not per row, and it also covers TRUNCATE."""
from django.db import migrations

V1_TABLES = ("v1_v1processgeneration", "v1_v1barrier", "v1_v1sourcecursor", "v1_v1workitem", "v1_v1outboundeffect",
             "v1_v1highwater")

CREATE = """
CREATE OR REPLACE FUNCTION cutover_v1_retired() RETURNS trigger LANGUAGE plpgsql AS $$
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
""" + "\n".join(f"""CREATE TRIGGER cutover_v1_retired BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {table}
  FOR EACH STATEMENT EXECUTE FUNCTION cutover_v1_retired();""" for table in V1_TABLES)

DROP = "\n".join(f"DROP TRIGGER IF EXISTS cutover_v1_retired ON {table};" for table in V1_TABLES) + """
DROP FUNCTION IF EXISTS cutover_v1_retired();"""


class Migration(migrations.Migration):
    dependencies = [("cutover", "0012_first_activation_barrier_set"), ("v1", "0002_v1_rules")]

    operations = [migrations.RunSQL(CREATE, DROP, hints={"target_db": "default"})]
