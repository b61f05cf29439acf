"""`manage.py delivery`: the REST bulk delivery operations CLI.

  delivery plan FILE.json        materialize, plan and admit a parent (the JSON names namespace, parent_key,
                                 binding, profile, route, boundary, resource, group, scope, generation, records)
  delivery run PARENT_KEY        drive its children (submit, send, poll, verify) until nothing can move
  delivery status [PARENT_KEY]   parents and children with their five axes, attempts and codes
  delivery reconciliations       every operation waiting for an operator (unknown, partial, unverified)
  delivery reconcile-open OP RECONCILIATION_ID --revision N --user NAME
  delivery reconcile-resolve OP RECONCILIATION_ID TARGET --revision N --proof JSON --user NAME
                                 (--revision: the operation's revision the decision was made on, as `status`
                                 and `reconciliations` print it; a moved operation is refused)
  delivery gate                  the mutation gate, journal epochs and audit findings
  delivery errors                the contract's error catalog

A refusal prints `code: detail` and the evidence schema name, and exits with the contract's `exit_class` for its
code (2: fix the request; 4: effect, reconciliation or journal condition); other refusals exit 2.
"""
from __future__ import annotations

import json
import sys
from datetime import date, datetime

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from effects.delivery.contract import contract
from effects.delivery.errors import DeliveryError
from effects.models import DeliveryOperation, DeliveryParent, DeliveryProfile, ReceiverBinding
from effects.services.delivery import journal, runner
from effects.services.delivery.planning import PlanRequest, parent_plan_and_admit
from effects.services.delivery.reconciliation import reconcile_open, reconcile_resolve


class Command(BaseCommand):
    help = __doc__.splitlines()[0]

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("plan").add_argument("file")
        sub.add_parser("run").add_argument("parent_key")
        sub.add_parser("status").add_argument("parent_key", nargs="?")
        sub.add_parser("reconciliations")
        opening = sub.add_parser("reconcile-open")
        opening.add_argument("operation", type=int)
        opening.add_argument("reconciliation_id")
        opening.add_argument("--user", required=True)
        opening.add_argument("--revision", type=int, required=True)
        opening.add_argument("--note", default="")
        resolving = sub.add_parser("reconcile-resolve")
        resolving.add_argument("operation", type=int)
        resolving.add_argument("reconciliation_id")
        resolving.add_argument("target")
        resolving.add_argument("--proof", required=True, help="JSON object")
        resolving.add_argument("--user", required=True)
        resolving.add_argument("--revision", type=int, required=True)
        resolving.add_argument("--note", default="")
        sub.add_parser("gate")
        sub.add_parser("errors")

    def handle(self, *args, **options):
        action = options["action"].replace("-", "_")
        try:
            getattr(self, f"do_{action}")(options)
        except DeliveryError as error:
            self.stderr.write(f"{error.code}: {error.detail}\nevidence schema: {error.spec.evidence_schema}; "
                              f"operator action: {error.spec.operator_action}")
            sys.exit(error.spec.exit_class)
        except ConnectorError as error:
            self.stderr.write(f"{error.code}: {error.detail}")
            sys.exit(getattr(error, "exit_class", 2))

    # -- actions ----------------------------------------------------------------------------------------------

    def do_plan(self, options):
        spec = json.loads(open(options["file"], encoding="utf-8").read())
        profile = DeliveryProfile.objects.get(name=spec["profile"])
        parse = date.fromisoformat if profile.scope_kind == "date" else datetime.fromisoformat
        parent = parent_plan_and_admit(PlanRequest(
            namespace=spec["namespace"], parent_key=spec["parent_key"],
            binding=ReceiverBinding.objects.get(name=spec["binding"]), profile=profile,
            logical_route_id=spec["route"], source_boundary=spec["source_boundary"],
            receiver_resource_id=spec["receiver_resource_id"], effect_conflict_group=spec["effect_conflict_group"],
            scope_start=parse(spec["scope"][0]), scope_end=parse(spec["scope"][1]),
            interval_end=datetime.fromisoformat(spec["interval_end"]),
            correction_revision=int(spec.get("correction_revision", 0)), records=spec["records"]))
        self.stdout.write(f"parent {parent.parent_key} {parent.state}: {parent.children.count()} children, "
                          f"plan {bytes(parent.parent_plan_digest).hex()[:16]}")

    def do_run(self, options):
        parent = self._parent(options["parent_key"])
        total = parent.children.count()
        states = runner.drive_parent(parent.pk, poll_interval=0.5)
        done = sum(1 for s in states if s.startswith("final_"))
        bar = "#" * int(30 * done / max(total, 1))
        self.stdout.write(f"[{bar:<30}] {done}/{total} final")
        self.do_status({"parent_key": parent.parent_key})
        if any(contract().tuples[s][1] in ("UNKNOWN", "PARTIALLY_APPLIED") for s in states):
            code = "REST_DELIVERY_REMOTE_EFFECT_UNKNOWN" if any(
                contract().tuples[s][1] == "UNKNOWN" for s in states) else "REST_DELIVERY_PARTIALLY_APPLIED"
            raise DeliveryError(code, "some children need reconciliation (manage.py delivery reconciliations)")

    def do_status(self, options):
        parents = DeliveryParent.objects.order_by("pk")
        if options.get("parent_key"):
            parents = [self._parent(options["parent_key"])]
        for parent in parents:
            self.stdout.write(f"{parent.parent_key}  {parent.state}  frontier {parent.contiguous_checkpoint_frontier}"
                              f"/{parent.children.count()}  generation ({parent.generation_end.isoformat()}, "
                              f"{parent.correction_revision})")
            for op in parent.children.order_by("ordinal"):
                axes = " ".join(contract().tuples[op.state])
                self.stdout.write(f"  #{op.pk} child {op.ordinal} {op.state:<34} [{axes}] attempts "
                                  f"{op.attempt_ordinal} {op.last_code} revision {op.revision}")

    def do_reconciliations(self, options):
        waiting = DeliveryOperation.objects.filter(state__regex=r"^(final_unknown|final_partial|final_full_unver"
                                                   r"|reconciling_)").order_by("pk")
        for op in waiting:
            spec = contract().errors.get(op.last_code)
            schema = spec.evidence_schema if spec else "dpone.rest_delivery_reconciliation.v1"
            targets = sorted(t.target for t in contract().transitions if t.operator_only and t.source == op.state)
            self.stdout.write(f"#{op.pk} {op.parent.parent_key}/{op.ordinal} {op.state} revision {op.revision} "
                              f"{op.last_code or '-'} "
                              f"evidence {schema}; next: {', '.join(targets)}")
        self.stdout.write(f"{waiting.count()} operation(s) wait for reconciliation")

    def do_reconcile_open(self, options):
        op = reconcile_open(actor=self._actor(options["user"]), operation_pk=options["operation"],
                            reconciliation_id=options["reconciliation_id"], note=options["note"],
                            expected_revision=options["revision"])
        self.stdout.write(f"#{op.pk} {op.state}")

    def do_reconcile_resolve(self, options):
        try:
            proof = json.loads(options["proof"])
        except ValueError as exc:
            raise CommandError(f"--proof is not JSON: {exc}") from exc
        op = reconcile_resolve(actor=self._actor(options["user"]), operation_pk=options["operation"],
                               reconciliation_id=options["reconciliation_id"], target=options["target"],
                               proof=proof, note=options["note"], expected_revision=options["revision"])
        self.stdout.write(f"#{op.pk} {op.state}")

    def do_gate(self, options):
        gate = journal.gate_row()
        self.stdout.write(f"mutation gate {gate.state} at journal epoch {gate.journal_epoch} (attested "
                          f"{journal.attested_epoch()}) {gate.blocked_reason}")
        for finding in journal.journal_audit():
            self.stdout.write(f"finding: {finding}")

    def do_errors(self, options):
        header = ("code", "exit class", "retryability", "operator action", "alert severity", "evidence schema")
        rows = [header] + [(code, str(spec.exit_class), str(spec.retryability), str(spec.operator_action),
                            str(spec.alert_severity), str(spec.evidence_schema))
                           for code, spec in contract().errors.items()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        for row in rows:
            self.stdout.write("  ".join([cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]))

    # -- helpers ----------------------------------------------------------------------------------------------

    def _parent(self, key: str) -> DeliveryParent:
        parent = DeliveryParent.objects.filter(parent_key=key).order_by("pk").first()
        if parent is None:
            raise CommandError(f"no parent {key!r}")
        return parent

    def _actor(self, username: str) -> Actor:
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        return Actor.for_user(user)
