"""Supervisor command for worker process generations: list them, or mark one terminated (its egress revoked) so
its open permits can be abandoned with proof."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from effects.models import DispatchPermit, ProcessGeneration
from effects.services import dispatch


class Command(BaseCommand):
    help = "List worker process generations, or terminate one: `holders terminate HOLDER_ID --evidence TEXT`."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list")
        terminate = sub.add_parser("terminate")
        terminate.add_argument("holder_id")
        terminate.add_argument("--evidence", required=True,
                               help="what proves the process is gone and its egress revoked")
        terminate.add_argument("--abandon", action="store_true", help="then abandon its open permits")

    def handle(self, *args, action: str, **options):
        if action == "list":
            for holder in ProcessGeneration.objects.order_by("pk"):
                open_permits = DispatchPermit.objects.filter(holder=holder, state__in=("granted", "sending")).count()
                self.stdout.write(f"{holder.holder_id}\t{holder.state}\theartbeat {holder.heartbeat_at:%Y-%m-%d %H:%M:%S}"
                                  f"\topen permits {open_permits}")
            return
        actor = Actor.system("supervisor")
        try:
            dispatch.holder_terminate(holder_id=options["holder_id"], evidence=options["evidence"], actor=actor)
            self.stdout.write(self.style.SUCCESS(f"{options['holder_id']} terminated; its egress is revoked"))
            if options["abandon"]:
                for permit in DispatchPermit.objects.filter(holder__holder_id=options["holder_id"],
                                                            state__in=("granted", "sending")).order_by("pk"):
                    effect = dispatch.permit_abandon(permit_pk=permit.pk, actor=actor)
                    self.stdout.write(f"permit #{permit.pk} abandoned: effect #{effect.pk} is {effect.state}")
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
