"""`manage.py cutover <action>`: the V1 -> V2 service cutover coordinator, one phase action per subcommand, the
same dispatch as the cutover console (cutover.services.cutover_phases). Every action is idempotent and resumable:
rerunning a finished one changes nothing, and `status` lists every phase with its receipts, blockers and next
actions.

  open --attempt K --configuration G --epoch E     open the attempt (verified candidate, running V1 generation)
  certify [--budgets FILE.json]                    preflight and the CutoverReadinessCertificate
  close | remeasure | abort --reason R | stop      barriers + halt; remeasure; fenced abort; terminate + isolate
  reconcile --effect ID --outcome O --evidence F --reason R   fenced v1_stopped reconciliation
  export | certify-drained                         tombstones + baselines; the V1ShutdownCertificate
  capture | rehearse | cold-abort | begin-validation          restore point and validation
  hold | activate | restore                        publication barriers; first activation; full restore
  recover [--release --reason R]                   take over a crashed coordinator's barrier set (this
                                                   coordinator becomes its holder) and follow the CutoverDecision
  status                                           every phase, as the console shows it
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from cutover.models import ServiceCutoverAttempt
from cutover.services import cutover_phases, v1_shutdown

SIMPLE = ("certify", "close", "remeasure", "abort", "stop", "export", "certify-drained", "capture", "rehearse",
          "cold-abort", "begin-validation", "hold", "activate", "restore")


class Command(BaseCommand):
    help = "Coordinate the V1 -> V2 service cutover, phase by phase (see `status`)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("open")
        p.add_argument("--attempt", required=True)
        p.add_argument("--configuration", required=True)
        p.add_argument("--epoch", required=True)
        p = sub.add_parser("status")
        p.add_argument("--attempt")
        p = sub.add_parser("reconcile")
        p.add_argument("--attempt", required=True)
        p.add_argument("--effect", required=True, help="the V1 effect row id the inventory lists")
        p.add_argument("--outcome", required=True, choices=("remote_finalized", "no_effect"))
        p.add_argument("--evidence", required=True, help="file holding the provider evidence")
        p.add_argument("--reason", required=True)
        for name in SIMPLE:
            p = sub.add_parser(name)
            p.add_argument("--attempt", required=True)
            if name == "certify":
                p.add_argument("--budgets", help="JSON file {phase: seconds}; default: the built-in plan")
            if name == "abort":
                p.add_argument("--reason", required=True)
        p = sub.add_parser("recover")
        p.add_argument("--attempt", required=True)
        p.add_argument("--release", action="store_true", help="release the set while rollback is still open")
        p.add_argument("--reason", default="")
        parser.add_argument("--coordinator", default="cutover-coordinator", help="this coordinator's identity")

    def handle(self, *args, action: str, **options):
        actor = Actor.system(f"cutover:{options['coordinator']}")
        try:
            if action == "open":
                attempt = v1_shutdown.cutover_open(
                    attempt_key=options["attempt"], configuration_generation_id=options["configuration"],
                    candidate_epoch_id=options["epoch"], actor=actor)
                self.stdout.write(f"attempt {attempt.attempt_key} open: {attempt.account_count} accounts, V1 "
                                  f"generation {attempt.v1_generation_id}")
            elif action == "status":
                self._status(options.get("attempt"))
            elif action == "reconcile":
                row = v1_shutdown.v1_reconcile(
                    attempt_key=options["attempt"], effect_row_id=options["effect"], outcome=options["outcome"],
                    evidence=Path(options["evidence"]).read_bytes(), reason=options["reason"],
                    expected_fences_digest=None, actor=actor)
                self.stdout.write(f"V1 effect {row.effect_row_id} reconciled: {row.outcome}")
            else:
                kwargs = {}
                if options.get("budgets"):
                    kwargs["budgets"] = json.loads(Path(options["budgets"]).read_text())
                if options.get("reason"):
                    kwargs["reason"] = options["reason"]
                if action == "recover":
                    kwargs.update(holder=str(actor), release=options["release"])
                started = time.monotonic()
                self.stdout.write(f"[{action}] running …")
                result = cutover_phases.run_action(attempt_key=options["attempt"], action=action.replace("-", "_"),
                                                   actor=actor, **kwargs)
                self.stdout.write(f"[{action}] done in {time.monotonic() - started:.1f}s: {result}")
                self._status(options["attempt"], compact=True)
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc

    def _status(self, attempt_key: str | None, compact: bool = False) -> None:
        attempt = (ServiceCutoverAttempt.objects.filter(attempt_key=attempt_key).first() if attempt_key
                   else ServiceCutoverAttempt.objects.order_by("-pk").first())
        if attempt is None and attempt_key:
            raise CommandError(f"no service cutover attempt {attempt_key!r}")
        if attempt is None:
            self.stdout.write("No cutover has started: V1 serves as before. `manage.py cutover open --attempt K "
                              "--configuration G --epoch E` (or the cutover console) begins one; docs/cutover.md "
                              "says what comes first.")
            return
        phases = cutover_phases.attempt_phases(attempt)
        done = sum(p.status == "done" for p in phases)
        width = 30
        bar = "#" * (width * done // len(phases)) + "-" * (width - width * done // len(phases))
        self.stdout.write(f"attempt {attempt.attempt_key} ({attempt.outcome})  [{bar}] {done}/{len(phases)} phases")
        for phase in phases:
            self.stdout.write(f"  {phase.status:8} {phase.title}")
            if compact:
                continue
            for name, value in phase.receipts:
                self.stdout.write(f"             {name}: {value}")
            for blocker in phase.blockers:
                self.stdout.write(f"             BLOCKED: {blocker}")
            for act, label in phase.actions:
                self.stdout.write(f"             next: cutover {act.replace('_', '-')} --attempt "
                                  f"{attempt.attempt_key}   ({label})")
