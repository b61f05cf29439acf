"""Operator command for an intentional new remote call (D-305): `remote_call authorize ACCOUNT INTENT_ID --root
ROOT --slot SLOT --reason TEXT --principal NAME [--scope SCOPE] [--body JSON --path-params JSON]`, or `remote_call
list ACCOUNT ROOT` to read every effect of a root with the intents recorded for it."""
from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from connector.actors import Actor
from connector.errors import ConnectorError
from effects import selectors
from effects.services import intents


def _json_object(text: str, name: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CommandError(f"--{name} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CommandError(f"--{name} must be a JSON object")
    return value


class Command(BaseCommand):
    help = "Authorize an intentional new remote call for an EffectRoot and slot, or list a root's effects."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        authorize = sub.add_parser("authorize")
        authorize.add_argument("account")
        authorize.add_argument("intent_id", help="the intent's identity: asking again with it returns the same intent")
        authorize.add_argument("--root", required=True, help="the EffectRootID")
        authorize.add_argument("--slot", required=True, help="the EffectSlotID")
        authorize.add_argument("--scope", default="runtime.records", help="the application scope")
        authorize.add_argument("--reason", required=True)
        authorize.add_argument("--principal", required=True, help="the operator who authorizes the call")
        authorize.add_argument("--body", help="the request body (JSON object; with --path-params; omitted: the "
                               "latest predecessor's request again)")
        authorize.add_argument("--path-params", help="the callout path parameters (JSON object)")
        listing = sub.add_parser("list")
        listing.add_argument("account")
        listing.add_argument("root")

    def handle(self, *args, action: str, **options):
        if action == "list":
            for row in selectors.effect_root_chain(account_key=options["account"], effect_root_id=options["root"]):
                self.stdout.write("\t".join(str(v) for v in row))
            return
        try:
            intent = intents.remote_call_authorize(
                account_key=options["account"], intent_id=options["intent_id"], application_scope=options["scope"],
                effect_root_id=options["root"], effect_slot_id=options["slot"],
                body=_json_object(options["body"], "body") if options["body"] is not None else None,
                path_params=(_json_object(options["path_params"], "path-params")
                             if options["path_params"] is not None else None), reason=options["reason"],
                actor=Actor(principal=f"operator:{options['principal']}"))
        except ConnectorError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        if intent.disposition == "resumed":
            self.stdout.write(f"intent {intent.intent_id}: resumed effect #{intent.resumed_effect_id}; "
                              "no new effect")
        else:
            command = intent.successor_command
            self.stdout.write(self.style.SUCCESS(
                f"intent {intent.intent_id}: successor {command.effect_generation_id} (command #{command.pk}) after "
                f"effect #{intent.predecessor_effect_id} proven no_effect"))
