-- A V1 process generation whose egress was isolated never has it reopened.
CREATE OR REPLACE FUNCTION v1_egress_never_reopens()
 RETURNS trigger
 LANGUAGE plpgsql
AS $$
BEGIN
  IF OLD.egress_isolated AND NOT NEW.egress_isolated THEN
    RAISE EXCEPTION 'V1 generation % has isolated provider egress: it never reopens', OLD.generation_id
      USING ERRCODE = '23000', CONSTRAINT = 'v1_generation_egress_never_reopens';
  END IF;
  RETURN NEW;
END $$;
