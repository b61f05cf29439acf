"""`manage.py succession <phase>`: the V2 -> V2 successor coordinator (requires_drain only), one phase per
subcommand. Every phase is idempotent and resumable: rerunning it after a crash or a refusal continues where the
durable state says, and `status` names the next phase.

  status     barrier set, gate modes, lanes and handoffs, and the next phase
  barriers   acquire the publication barrier set (`acquiring`), reread the successor's owners and hold it
  drain      with every gate still v2_serving, close the predecessor's new roots (SUCCESSION_ROOTS_CLOSED) and
             let its continuation work drain; drained once the inventory measured in the database is empty
             (rerun until then: no timeout; `release` aborts)
  halt       after the drain, move every gate v2_serving -> halting_v2 -> v2_halted (an open permit keeps it halting_v2)
  handoffs   one OrderingHandoff per predecessor lane (refused lanes are listed; rerun after draining them)
  activate   the one successor activation transaction, then readback and barrier release
  release    explicit fenced release (abort before any handoff; `--replacement` after the cutoff)
  takeover   a new coordinator (`--holder`) takes over the open barrier set of a crashed one: one holder-fenced
             step (the set, its drain and handoffs stay; the fence advances; every later act of the earlier
             holder is refused with FENCE_STALE, D-133); `--resume` then continues as the set's state says
             (`acquiring`/`held`: hold, drain, halt, handoffs, activate; `activation_committed`: read back, release)
  retire     the draining predecessor `draining -> retired`, once every fact naming it is terminal (D-267)

All phases take `--predecessor EPOCH_ID`; `release` and `retire` also `--reason`; `barriers` also `--successor EPOCH_ID`; the coordinator identity is
`--holder` (a set held by another holder is refused with FENCE_STALE: a stale coordinator cannot act on it;
`takeover` is how a new holder takes it).
"""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.selectors.rows import ServingEpoch
from connector.services import serving
from cutover.selectors import barrier_set_open_for, succession_status
from cutover.services import fencing, succession, succession_phases, succession_recovery


class Command(BaseCommand):
    help = "Coordinate a V2 -> V2 successor activation (requires_drain): status | barriers | drain | halt | " \
           "handoffs | activate | release | retire | takeover."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="phase", required=True)
        for name in ("status", "barriers", "drain", "halt", "handoffs", "activate", "release",
                     "retire", "takeover"):
            p = sub.add_parser(name)
            p.add_argument("--predecessor", required=True, help="the active predecessor epoch ID")
            p.add_argument("--holder", default="succession-coordinator", help="this coordinator's identity")
            if name in ("barriers", "status"):
                p.add_argument("--successor", required=(name == "barriers"), help="the verified successor epoch ID")
            if name == "barriers":
                p.add_argument("--class", dest="successor_class", default="requires_drain")
            if name in ("release", "retire"):
                p.add_argument("--reason", required=True)
            if name == "release":
                p.add_argument("--replacement", action="store_true",
                               help="after the first handoff: release only to replace the candidate")
            if name == "takeover":
                p.add_argument("--resume", action="store_true",
                               help="after the takeover, continue every remaining phase as this holder")

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
            raise CommandError(f"FENCE_STALE: {row} is held by {row.holder}, not {holder}; a stale coordinator may "
                               "not act (a new coordinator takes it over with `succession takeover`)")
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
        self.stdout.write(f"drain       {s.drain or '-'}")
        self.stdout.write("gates       " + ", ".join(f"{m}={n}" for m, n in sorted(s.gate_modes.items())))
        self.stdout.write(f"handoffs    {s.handoffs}/{s.lanes} predecessor lanes")
        self.stdout.write(self.style.SUCCESS(f"next phase  {s.next_phase}"))

    def phase_barriers(self, *, holder: str, successor: str, successor_class: str, **_):
        row = succession.barrier_set_acquire(predecessor_epoch_id=self.predecessor.epoch_id,
                                             successor_epoch_id=successor, holder=holder, actor=self.actor,
                                             successor_class=successor_class)
        self.stdout.write(f"barrier set #{row.pk} {row.state} (fence {row.fence})")
        row = succession.barrier_set_hold(barrier_set_pk=row.pk, expected_fence=row.fence, actor=self.actor,
                                          holder=holder)
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state} (fence {row.fence}); owner "
                                             f"receipts {bytes(row.owner_receipts_digest).hex()[:16]}…"))

    def phase_drain(self, *, holder: str, **_):
        row = self._open_set(holder)
        drain, inventory = succession_phases.drain_all(barrier_set=row, actor=self.actor, holder=holder)
        if drain.state != "drained":
            raise CommandError(f"{drain}: predecessor continuation work still open (new roots stay refused; rerun "
                               f"when it finished, or `release` to abort): {inventory.describe()}")
        self.stdout.write(self.style.SUCCESS(f"{drain}: continuation work drained under v2_serving"))

    def phase_halt(self, *, holder: str, **_):
        row = self._open_set(holder)
        outcome = succession_phases.halt_drained(barrier_set=row, actor=self.actor, on_step=self._progress,
                                                 holder=holder)
        if outcome.refused:
            raise CommandError("not every gate is v2_halted (rerun when open permits settled):\n  "
                               + "\n  ".join(outcome.refused))
        self.stdout.write(self.style.SUCCESS(f"{outcome.total} gates v2_halted"))

    def phase_handoffs(self, *, holder: str, **_):
        row = self._open_set(holder)
        outcome = succession_phases.handoff_all(barrier_set=row, actor=self.actor, on_step=self._progress,
                                                holder=holder)
        if outcome.refused:
            raise CommandError(f"{len(outcome.refused)} lane(s) refused; drain them and rerun:\n  "
                               + "\n  ".join(outcome.refused))
        self.stdout.write(self.style.SUCCESS(f"{outcome.total} predecessor lanes handed off"))

    def phase_activate(self, *, holder: str, **_):
        row = self._open_set(holder)
        successor, row = succession_phases.activate_and_release(barrier_set=row, expected_fence=row.fence,
                                                                actor=self.actor, holder=holder)
        self.stdout.write(f"successor {successor.epoch_id} {successor.state}; read back")
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state}; {successor.epoch_id} serves"))

    def phase_release(self, *, holder: str, reason: str, replacement: bool, **_):
        row = self._open_set(holder)
        row = succession.barrier_set_release(barrier_set_pk=row.pk, expected_fence=row.fence, reason=reason,
                                             replacement=replacement, actor=self.actor, holder=holder)
        self.stdout.write(self.style.SUCCESS(f"barrier set #{row.pk} {row.state}"))

    def phase_takeover(self, *, holder: str, resume: bool, **_):
        """A crashed coordinator's set, taken over by this one (D-133); nothing here waits for time to pass."""
        current = barrier_set_open_for(predecessor_epoch_pk=self.predecessor.pk)
        if current is None:
            raise CommandError("no open barrier set for this predecessor; nothing to take over")
        row = fencing.barrier_set_takeover(barrier_set_pk=current.pk, holder=holder, actor=self.actor)
        self.stdout.write(f"barrier set #{row.pk} {row.state} (fence {row.fence}) held by {row.holder}")
        if not resume:
            return
        result = succession_recovery.succession_resume(predecessor_epoch_id=self.predecessor.epoch_id,
                                                       holder=holder, actor=self.actor)
        if result.stopped_at:
            raise CommandError(f"stopped at `{result.stopped_at}` (rerun `takeover --resume` or that phase with "
                               f"--holder {holder} when it can proceed): {result.blocked_by}")
        self.stdout.write(self.style.SUCCESS(f"barrier set #{result.barrier_set_pk} {result.set_state} (fence "
                                             f"{result.fence}); the successor serves"))

    def phase_retire(self, *, reason: str, **_):
        """The predecessor's facts are all terminal (each refusal names its code and rows): retire it. Nothing
        retires an epoch on a timer; this explicit, reasoned step is the only way (CV2-11-026, CV2-13-005)."""
        epoch = serving.epoch_retire(epoch_pk=self.predecessor.pk, actor=self.actor, reason=reason,
                                     expected_digest=bytes(self.predecessor.digest))
        self.stdout.write(self.style.SUCCESS(f"epoch {epoch.epoch_id} {epoch.state}"))
