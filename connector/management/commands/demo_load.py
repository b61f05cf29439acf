"""Load the demo world once (idempotent) and print the operator's credentials."""
from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from connector.demo import build_world
from connector.models import ServingEpoch

OPERATOR = "operator"
# One person per governance role (groups made by the governance app after migrate), same demo password.
ROLE_USERS = {"ann": "auditor", "oscar": "operator", "alma": "approver", "abe": "approver", "cid": "certifier",
              "cora": "certifier"}


class Command(BaseCommand):
    help = "Load the demo world (accounts, packs, Catalog view, credentials, configuration, epochs) and an operator."

    def add_arguments(self, parser):
        parser.add_argument("--password", default=os.environ.get("DEMO_OPERATOR_PASSWORD"),
                            help="operator password (default: $DEMO_OPERATOR_PASSWORD, else a new random one)")

    def handle(self, *args, password: str | None, **options):
        users = get_user_model()
        password = password or secrets.token_urlsafe(12)
        with transaction.atomic():
            user, created = users.objects.get_or_create(username=OPERATOR, defaults={"is_staff": True,
                                                                                     "is_superuser": True})
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
            from django.contrib.auth.models import Group

            for name, role in ROLE_USERS.items():
                person, _ = users.objects.get_or_create(username=name, defaults={"is_staff": True})
                person.set_password(password)
                person.save()
                group = Group.objects.filter(name=role).first()
                if group is not None:
                    person.groups.add(group)
        if ServingEpoch.objects.filter(epoch_id="epoch-1").exists():
            self.stdout.write("Demo world already loaded: nothing to do.")
        else:
            self.stdout.write("Loading the demo world through the services ...")
            world = build_world("", push=True, sequenced=True, idempotency_contract=True)
            channels = ", ".join(world.view.bindings.filter(kind="inbound_route").order_by("business_key")
                                 .values_list("business_key", flat=True))
            self.stdout.write(self.style.SUCCESS(
                f"  {len(world.accounts)} accounts, {len(world.packs)} pack generations, Catalog view "
                f"{world.view.view_key} r{world.view.revision} ({world.view.bindings.count()} bindings; inbound "
                f"channels: {channels}), "
                f"{len(world.credential_generation_ids)} credential generations, configuration "
                f"{world.configuration.generation_id}, active epoch {world.active_epoch.epoch_id}, verified epoch "
                f"{world.verified_epoch.epoch_id}"))
        self.stdout.write(self.style.SUCCESS(
            f"Operator login: username '{OPERATOR}' password '{password}'"
            + ("" if created else " (password reset for this run)")))
        self.stdout.write(self.style.SUCCESS(
            "Governance screens (/): " + ", ".join(f"{name} ({role})" for name, role in ROLE_USERS.items())
            + " with the same password"))
