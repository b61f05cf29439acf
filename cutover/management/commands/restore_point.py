"""`manage.py restore_point <step> ATTEMPT_KEY`: the V1 side of a service cutover after the drain. Every step is
idempotent or resumable; `status` names the next one.

  status            attempt outcome, gate modes, restore point, rehearsals, CutoverDecision, RestoreAttempt
  capture           take the V1RestorePoint (v1_drained, no V2 mutation; pg_dump of one exported snapshot)
  rehearse          restore the dump into a scratch database, verify it, boot the exact V1 release there
  begin-validation  (rehearsed, no drift) open the CutoverDecision and move every gate to v2_validating
  cold-abort        (v1_drained, before validation) a new V1 generation; gates back to v1_serving
  restore           (v2_validating, activation not chosen) the full restore; rerun to resume after a crash
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import AccountServingGate
from cutover.services import restore, restore_point
from cutover.services.decision import decision_read
from cutover.services.v2_scope import attempt_account_ids

STEPS = ("status", "capture", "rehearse", "begin-validation", "cold-abort", "restore")


class Command(BaseCommand):
    help = "V1 restore point and V1 return paths of a service cutover: " + " | ".join(STEPS) + "."

    def add_arguments(self, parser):
        parser.add_argument("step", choices=STEPS)
        parser.add_argument("attempt_key")
        parser.add_argument("--operator", default="cutover-coordinator", help="who acts (recorded)")

    def handle(self, *args, step: str, attempt_key: str, operator: str, **options):
        actor = Actor.system(f"cutover:{operator}")
        try:
            if step == "status":
                self._status(attempt_key)
            elif step == "capture":
                point = restore_point.restore_point_capture(attempt_key=attempt_key, actor=actor.principal)
                self.stdout.write(f"restore point {bytes(point.digest).hex()} dump {point.dump_path} "
                                  f"({point.dump_bytes} bytes)")
            elif step == "rehearse":
                rehearsal = restore_point.restore_point_rehearse(attempt_key=attempt_key, actor=actor.principal)
                self.stdout.write(f"rehearsal {bytes(rehearsal.digest).hex()} passed in {rehearsal.scratch_database}")
            elif step == "begin-validation":
                gates = restore.cutover_begin_validation(attempt_key=attempt_key, actor=actor)
                self.stdout.write(f"{len(gates)} gates v2_validating; CutoverDecision rollback_open")
            elif step == "cold-abort":
                generation = restore.cutover_cold_abort(attempt_key=attempt_key, actor=actor)
                self.stdout.write(f"cold aborted: V1 generation {generation} serving")
            else:
                row = restore.restore_run(attempt_key=attempt_key, actor=actor)
                self.stdout.write(f"restore {row.state}; V1 generation {row.v1_generation_id or '-'}")
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc

    def _status(self, attempt_key: str) -> None:
        attempt = restore_point.attempt_for(attempt_key)
        modes: dict[str, int] = {}
        for mode in AccountServingGate.objects.filter(account_id__in=attempt_account_ids(attempt)) \
                .values_list("mode", flat=True):
            modes[mode] = modes.get(mode, 0) + 1
        point = restore_point.restore_point_for(attempt_key)
        decision = decision_read(attempt_key)
        row = restore.restore_attempt_for(attempt_key)
        rehearsals = point.rehearsals.count() if point else 0
        lines = [f"attempt {attempt_key}: {attempt.outcome}",
                 "gates: " + ", ".join(f"{m}={n}" for m, n in sorted(modes.items())),
                 f"restore point: {bytes(point.digest).hex() if point else '-'} rehearsals: {rehearsals}",
                 f"decision: {decision.state if decision else '-'}", f"restore: {row.state if row else '-'}"]
        if attempt.outcome != "open":
            step = "done"
        elif row is not None or (decision and decision.state == "restoring_v1"):
            step = "restore (resume)"
        elif decision is not None:
            step = "activation, or restore"
        elif point is None:
            step = "capture (or cold-abort)"
        elif not rehearsals:
            step = "rehearse (or cold-abort)"
        else:
            step = "begin-validation (or cold-abort)"
        lines.append(f"next: {step}")
        self.stdout.write("\n".join(lines))
