"""`manage.py gate_halt ACCOUNT_KEY --reason TEXT [--timeout SECONDS]`: halt one account's V2 gate and wait for its
drain (issue 20 goal 5, D-401). `halt_v2`, then `confirm_halted` as soon as the gate's last open permit settles
(`halt_wait.wait_halted`: woken by the closing transaction's notification, the open-permit set re-read under the
gate's lock). If permits are still open when the timeout passes, the gate stays `halting_v2` (waiting is never a
timeout on the halt, CV2-11-009) and the command exits non-zero with the refusal's code and what blocks it."""
from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.models import ConnectorAccount
from connector.services.gates import gate_transition
from connector.services.halt_wait import wait_halted


class Command(BaseCommand):
    help = "Halt one account's V2 gate and confirm the halt as soon as its open permits have settled."

    def add_arguments(self, parser):
        parser.add_argument("account_key")
        parser.add_argument("--reason", required=True, help="why the account is halted (audited)")
        parser.add_argument("--timeout", type=float, default=30.0,
                            help="seconds to wait for the open permits to settle (default 30); the gate then "
                                 "stays halting_v2")

    def handle(self, *args, account_key: str, reason: str, timeout: float, **options):
        account = ConnectorAccount.objects.filter(account_key=account_key).first()
        if account is None:
            raise CommandError(f"ACCOUNT_NOT_FOUND: no connector account has the key {account_key!r}")
        actor = Actor.system("gate-halt-cli")
        started = time.monotonic()
        try:
            gate = gate_transition(account_id=account.pk, action="halt_v2", expected_fence=None, actor=actor,
                                   reason=reason)
            self.stdout.write(f"{account_key}: {gate.mode} (fence {gate.fence}); waiting for open permits to settle")
            out = wait_halted(account_id=account.pk, actor=actor, reason=reason, timeout=timeout)
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        gate = out["gate"]
        self.stdout.write(self.style.SUCCESS(
            f"{account_key}: {gate.mode} (fence {gate.fence}) after {(time.monotonic() - started) * 1000:.0f} ms, "
            f"{out['attempts']} confirm attempt(s), {out['wakeups']} settlement notification(s)"))
