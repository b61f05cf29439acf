"""`manage.py bench <subcommand>`: measurements of the connector's hot paths on throwaway databases. Each
subcommand is one `bench.subcommand.Subcommand` in SUBCOMMANDS, in its own module of `bench/` (docs/benchmarks.md).
The command exists where the `bench` app is installed: the development and test settings (D-512)."""
from __future__ import annotations

import os
import sys

from django.core.management.base import BaseCommand

from bench.accounts import Accounts
from bench.activation_command import Activation
from bench.admission_profile import AdmissionProfile
from bench.burst import Burst
from bench.claims import Claims
from bench.halt_drain import HaltDrain
from bench.history import History
from bench.hot_account import HotAccount
from bench.metrics_plans import MetricsPlans
from bench.outbound import Outbound
from bench.outbound_rate import OutboundRate
from bench.overhead import Overhead
from bench.subcommand import Subcommand

SUBCOMMANDS: dict[str, Subcommand] = {s.name: s for s in (
    History(), HotAccount(), Activation(), Burst(), Accounts(), Claims(), Overhead(), MetricsPlans(), OutboundRate(),
    Outbound(), HaltDrain(), AdmissionProfile())}


def run_as_administrator(command: Command) -> None:
    """The benches create, migrate and drop throwaway databases, which the application role may not. When
    `.data/services.env` names the administrator (DATABASE_ADMIN_URL) and this process connects as someone else,
    start the same command again as the administrator, the way `make bench` runs it (children inherit it)."""
    admin = os.environ.get("DATABASE_ADMIN_URL")
    if not getattr(command, "_called_from_command_line", False) or not admin \
            or os.environ.get("DATABASE_URL") == admin:
        return
    command.progress("bench: throwaway databases need the administrator; running as DATABASE_ADMIN_URL "
                     f"({admin.split('@')[-1]})")
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_DATABASE_URL", "DATABASE_ASSUME_ROLE")}
    env["DATABASE_URL"] = admin
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


class Command(BaseCommand):
    help = "Performance measurements on a throwaway database. Subcommands: " + ", ".join(SUBCOMMANDS)

    def add_arguments(self, parser):
        subparsers = parser.add_subparsers(dest="subcommand", required=True, metavar="subcommand")
        for sub in SUBCOMMANDS.values():
            sub.add_arguments(subparsers.add_parser(sub.name, help=sub.help, description=sub.help))

    def progress(self, message: str) -> None:
        """Progress goes to stderr, so `--json` output on stdout stays machine-readable."""
        self.stderr.write(message)
        self.stderr.flush()

    def handle(self, *args, subcommand: str, **options):
        run_as_administrator(self)
        SUBCOMMANDS[subcommand].handle(self, options)
        sys.stdout.flush()
