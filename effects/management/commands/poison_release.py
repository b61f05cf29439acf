"""Operator remediation of a poison item once its cause is fixed (decision D-168): put a held receipt back in the
materialization queue, reopen a lane halted by a failed lane step, lift an effect's EFFECT_STEP_FAILED hold, or
put a held delivery operation back in the sweep. Each release is audited with the reason given; the StepFailure
evidence stays. Quarantined executions and windows are final: their remediation is a replay.

The bulk form (D-490) releases every item held with one reason code (of one account with `--account`) after an
outage: `poison_release --code MATERIALIZATION_FAILED --account acme-eu --all --reason TEXT`. It calls the same
per-item release service once per item, each in its own transaction with its own audit row, and prints a line per
item; an item released meanwhile by someone else is reported refused and the others go on. The exit status is 0
when every item was released, 1 (a CommandError) when any was refused."""
from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from connector.services import poison
from effects.selectors import RELEASABLE_KINDS, poison_held
from effects.services import poison as effects_poison


class Command(BaseCommand):
    help = ("Release one held item: `poison_release (--receipt|--lane|--effect|--delivery) ID --reason TEXT`; or "
            "every item held with one code: `poison_release --code CODE [--account KEY] --all --reason TEXT`.")

    def add_arguments(self, parser):
        kind = parser.add_mutually_exclusive_group(required=True)
        kind.add_argument("--receipt", type=int, help="a Receipt held with MATERIALIZATION_FAILED")
        kind.add_argument("--lane", type=int, help="an OrderingLane halted with LANE_STEP_FAILED")
        kind.add_argument("--effect", type=int, help="a RemoteEffect held with EFFECT_STEP_FAILED")
        kind.add_argument("--delivery", type=int, help="a DeliveryOperation held with DELIVERY_STEP_FAILED")
        kind.add_argument("--code", choices=sorted(RELEASABLE_KINDS),
                          help="bulk: every item held with this reason code (needs --all)")
        parser.add_argument("--account", help="bulk: only the items of this account key")
        parser.add_argument("--all", action="store_true", help="bulk: confirm that every matching item is released")
        parser.add_argument("--reason", required=True, help="what was fixed (audited)")
        parser.add_argument("--operator", default="operator", help="who releases it (audited)")

    def handle(self, *args, reason: str, operator: str, **options):
        actor = Actor.system(f"operator:{operator}")
        if options.get("code"):
            return self.bulk(code=options["code"], account=options.get("account"), confirmed=options["all"],
                             actor=actor, reason=reason)
        if options.get("account") or options["all"]:
            raise CommandError("--account and --all belong to the bulk form (--code CODE)")
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

    def bulk(self, *, code: str, account: str | None, confirmed: bool, actor: Actor, reason: str) -> None:
        if not confirmed:
            raise CommandError("the bulk form releases every matching item: add --all to confirm")
        if not reason.strip():
            raise CommandError("TRANSITION_REFUSED: a release needs a reason")
        kind = RELEASABLE_KINDS[code]
        pks = poison_held(code=code, account_key=account)
        where = f" of account {account}" if account else ""
        self.stdout.write(f"{len(pks)} {kind}(s) held with {code}{where}")
        refused = 0
        for n, pk in enumerate(pks, start=1):
            try:
                released = effects_poison.poison_release_item(code=code, pk=pk, actor=actor, reason=reason)
                word = "released" if released else "refused TRANSITION_REFUSED: not held any more"
            except ConnectorError as exc:
                released, word = False, f"refused {exc.code}: {exc.detail}"
            except ObjectDoesNotExist:
                released, word = False, "refused TRANSITION_REFUSED: no such item any more"
            refused += not released
            line = f"[{n}/{len(pks)}] {kind} {pk} {word}"
            self.stdout.write(self.style.SUCCESS(line) if released else self.style.WARNING(line))
        self.stdout.write(f"{len(pks) - refused} released, {refused} refused")
        if refused:
            raise CommandError(f"{refused} of {len(pks)} {kind}(s) were not released (see the lines above)")
