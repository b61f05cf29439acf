"""Operator remediation of a poison item once its cause is fixed (decision D-168): put a held receipt back in the
materialization queue, reopen a lane halted by a failed lane step, lift an effect's EFFECT_STEP_FAILED hold, or
put a held delivery operation back in the sweep. Each release is audited with the reason given; the StepFailure
evidence stays. Quarantined executions and windows are final: their remediation is a replay."""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.services import poison
from effects.services import poison as effects_poison


class Command(BaseCommand):
    help = "Release one held item: `poison_release (--receipt|--lane|--effect|--delivery) ID --reason TEXT`."

    def add_arguments(self, parser):
        kind = parser.add_mutually_exclusive_group(required=True)
        kind.add_argument("--receipt", type=int, help="a Receipt held with MATERIALIZATION_FAILED")
        kind.add_argument("--lane", type=int, help="an OrderingLane halted with LANE_STEP_FAILED")
        kind.add_argument("--effect", type=int, help="a RemoteEffect held with EFFECT_STEP_FAILED")
        kind.add_argument("--delivery", type=int, help="a DeliveryOperation held with DELIVERY_STEP_FAILED")
        parser.add_argument("--reason", required=True, help="what was fixed (audited)")
        parser.add_argument("--operator", default="operator", help="who releases it (audited)")

    def handle(self, *args, reason: str, operator: str, **options):
        actor = Actor.system(f"operator:{operator}")
        releases = {
            "receipt": lambda pk: poison.materialization_release(receipt_pk=pk, actor=actor, reason=reason),
            "lane": lambda pk: poison.lane_release(lane_pk=pk, actor=actor, reason=reason),
            "effect": lambda pk: effects_poison.effect_release(effect_pk=pk, actor=actor, reason=reason),
            "delivery": lambda pk: effects_poison.delivery_release(operation_pk=pk, actor=actor, reason=reason),
        }
        kind, pk = next((k, options[k]) for k in releases if options.get(k) is not None)
        try:
            released = releases[kind](pk)
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        except ObjectDoesNotExist as exc:
            raise CommandError(f"no {kind} {pk}") from exc
        if not released:
            raise CommandError(f"{kind} {pk} is not held by a step failure; nothing was released")
        self.stdout.write(self.style.SUCCESS(f"{kind} {pk} released; the next sweep picks it up"))
