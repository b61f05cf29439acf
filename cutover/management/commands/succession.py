"""`manage.py succession <phase>`: the V2 -> V2 successor coordinator (requires_drain only), one phase per
subcommand. Every phase is idempotent and resumable: rerunning it after a crash or a refusal continues where the
durable state says, and `status` names the next phase.

  status     barrier set, gate modes, lanes and handoffs, and the next phase
  barriers   acquire the publication barrier set (`acquiring`), reread the successor's owners and hold it
  halt       move every gate v2_serving -> halting_v2 -> v2_halted (an open permit keeps it halting_v2)
  handoffs   one OrderingHandoff per predecessor lane (refused lanes are listed; rerun after draining them)
  activate   the one successor activation transaction, then readback and barrier release
  release    explicit fenced release (abort before any handoff; `--replacement` after the cutoff)

All phases take `--predecessor EPOCH_ID`; `barriers` also `--successor EPOCH_ID`; the coordinator identity is
`--holder` (a set held by another holder is refused: a stale coordinator cannot act on it).
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.choices import GateMode
from connector.errors import ConnectorError
from connector.models import AccountServingGate, OrderingLane, ServingEpoch
from connector.services import gates as gate_services
from cutover.models import OrderingHandoff
from cutover.selectors import barrier_set_open_for, succession_status
from cutover.services import succession


class Command(BaseCommand):
    help = "Coordinate a V2 -> V2 successor activation (requires_drain): status | barriers | halt | handoffs | " \
           "activate | release."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="phase", required=True)
        for name in ("status", "barriers", "halt", "handoffs", "activate", "release"):
            p = sub.add_parser(name)
            p.add_argument("--predecessor", required=True, help="the active predecessor epoch ID")
            p.add_argument("--holder", default="succession-coordinator", help="this coordinator's identity")
            if name in ("barriers", "status"):
                p.add_argument("--successor", required=(name == "barriers"), help="the verified successor epoch ID")
            if name == "barriers":
                p.add_argument("--class", dest="successor_class", default="requires_drain")
            if name == "release":
                p.add_argument("--reason", required=True)
                p.add_argument("--replacement", action="store_true",
                               help="after the first handoff: release only to replace the candidate")

    def handle(self, *args, phase: str, **options):
        self.actor = Actor.system(f"succession:{options['holder']}")
        try:
            self.predecessor = ServingEpoch.objects.get(epoch_id=options["predecessor"])
        except ServingEpoch.DoesNotExist as exc:
            raise CommandError(f"no epoch {options['predecessor']}") from exc
        try:
            getattr(self, f"phase_{phase}")(**options)
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc

    # -- helpers --------------------------------------------------------------------------------------------

    def _open_set(self, holder: str):
        row = barrier_set_open_for(predecessor_epoch_pk=self.predecessor.pk)
        if row is None:
            raise CommandError("no open barrier set for this predecessor; run `succession barriers` first")
        if row.holder != holder:
            raise CommandError(f"{row} is held by {row.holder}, not {holder}; a stale coordinator may not act")
        return row

    def _progress(self, i: int, n: int, text: str) -> None:
        width = 20
        done = width * i // max(n, 1)
        self.stdout.write(f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {text}")

    # -- phases ---------------------------------------------------------------------------------------------

    def phase_status(self, **options):
        s = succession_status(predecessor_epoch_id=self.predecessor.epoch_id,
                              successor_epoch_id=options.get("successor"))
        self.stdout.write(f"predecessor {s.predecessor.epoch_id}: {s.predecessor.state}")
        self.stdout.write(f"successor   {s.successor.epoch_id + ': ' + s.successor.state if s.successor else '-'}")
        b = s.barrier_set
        self.stdout.write(f"barrier set {f'#{b.pk} {b.state} fence {b.fence} holder {b.holder}' if b else 'none open'}")
        self.stdout.write("gates       " + ", ".join(f"{m}={n}" for m, n in sorted(s.gate_modes.items())))
        self.stdout.write(f"handoffs    {s.handoffs}/{s.lanes} predecessor lanes")
        self.stdout.write(self.style.SUCCESS(f"next phase  {s.next_phase}"))

    def phase_barriers(self, *, holder: str, successor: str, successor_class: str, **_):
        row = succession.barrier_set_acquire(predecessor_epoch_id=self.predecessor.epoch_id,
                                             successor_epoch_id=successor, holder=holder, actor=self.actor,
                                             successor_class=successor_class)
        self.stdout.write(f"barrier set #{row.pk} {row.state} (fence {row.fence})")
        row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=self.actor)
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state} (fence {row.fence}); owner "
                                             f"receipts {bytes(row.owner_receipts_digest).hex()[:16]}…"))

    def phase_halt(self, **_):
        accounts = sorted(self.predecessor.configuration.accounts.values_list("account_id", flat=True))
        blocked = []
        for i, account_id in enumerate(accounts, 1):
            gate = AccountServingGate.objects.get(account_id=account_id)
            try:
                if gate.mode == GateMode.V2_SERVING:
                    gate = gate_services.gate_transition(account_id=account_id, action="halt_v2",
                                                         expected_fence=gate.fence, actor=self.actor,
                                                         reason="successor activation (requires_drain)")
                if gate.mode == GateMode.HALTING_V2:
                    gate = gate_services.gate_transition(account_id=account_id, action="confirm_halted",
                                                         expected_fence=gate.fence, actor=self.actor,
                                                         reason="successor activation (requires_drain)")
            except ConnectorError as exc:
                blocked.append(f"account {account_id}: {exc.detail}")
            self._progress(i, len(accounts), f"account {account_id}: {gate.mode}")
        if blocked:
            raise CommandError("not every gate is v2_halted (rerun when open permits settled):\n  "
                               + "\n  ".join(blocked))
        self.stdout.write(self.style.SUCCESS(f"{len(accounts)} gates v2_halted"))

    def phase_handoffs(self, *, holder: str, **_):
        row = self._open_set(holder)
        lanes = list(OrderingLane.objects.filter(epoch=self.predecessor).order_by("pk").values_list("pk", flat=True))
        done = set(OrderingHandoff.objects.filter(successor_epoch_id=row.successor_epoch_id)
                   .values_list("predecessor_lane_id", flat=True))
        refused = []
        for i, lane_pk in enumerate(lanes, 1):
            if lane_pk in done:
                self._progress(i, len(lanes), f"lane {lane_pk}: already handed off")
                continue
            try:
                h = succession.ordering_handoff(barrier_set_pk=row.pk, lane_pk=lane_pk, actor=self.actor)
                self._progress(i, len(lanes), f"lane {lane_pk}: frozen at high-water {h.high_water}")
            except ConnectorError as exc:
                refused.append(f"lane {lane_pk}: {exc.detail}")
                self._progress(i, len(lanes), f"lane {lane_pk}: REFUSED")
        if refused:
            raise CommandError(f"{len(refused)} lane(s) refused; drain them and rerun:\n  " + "\n  ".join(refused))
        self.stdout.write(self.style.SUCCESS(f"{len(lanes)} predecessor lanes handed off"))

    def phase_activate(self, *, holder: str, **_):
        row = self._open_set(holder)
        successor = succession.successor_activate(barrier_set_pk=row.pk, expected_fence=row.fence, actor=self.actor)
        self.stdout.write(f"successor {successor.epoch_id} {successor.state}; readback and release…")
        row = self._open_set(holder)
        row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence,
                                             reason="successor activation read back", actor=self.actor)
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state}; {successor.epoch_id} serves"))

    def phase_release(self, *, holder: str, reason: str, replacement: bool, **_):
        row = self._open_set(holder)
        row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason=reason,
                                             replacement=replacement, actor=self.actor)
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state}"))
