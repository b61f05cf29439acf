"""Shared pieces of the hostile-input tests: a small world with an operator and one materialized receipt, row
counts of every table the API could write, and signing."""
from __future__ import annotations

import json
from dataclasses import dataclass

from django.apps import apps
from django.contrib.auth.models import Permission, User
from django.db import connection

from connector.actors import Actor
from connector.demo import build_world
from connector.models import CredentialGeneration, Event
from connector.secrets import secret_backend
from connector.services.admission import receipt_admit
from connector.services.materialize import receipt_materialize
from connector.services.signatures import sign

CHANNEL = "records.webhook"
OPERATOR = "fuzz-operator"
OPERATOR_PASSWORD = "fuzz-operator-password"


def delivery(n: int) -> bytes:
    return json.dumps({"events": [{"id": f"fz-ev-{n}", "type": "record.updated", "record_id": f"fz-r-{n % 7}",
                                   "sequence": n, "occurred_at": "2026-01-01T00:00:00Z",
                                   "data": {"name": f"Fuzz {n}", "email": f"f{n}@example.com"}}]}).encode()


@dataclass
class ApiWorld:
    account_key: str
    channel: str
    secret: bytes
    receipt_id: int
    epoch_id: str
    epoch_digest: str
    event_id: int
    event_digest: str

    def sign(self, body: bytes, timestamp: int) -> str:
        return sign(self.secret, timestamp, body)

    @staticmethod
    def delivery(n: int) -> bytes:
        return delivery(n)


def build_api_world(prefix: str = "f-") -> ApiWorld:
    world = build_world(prefix)
    account = world.accounts[0]
    user = User.objects.create_user(OPERATOR, password=OPERATOR_PASSWORD)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="connector",
                                                         codename__in=["add_replayrequest", "view_receipt"]))
    admission = receipt_admit(account_key=account.account_key, channel=CHANNEL, transport_key="seed-1",
                              body=delivery(0), actor=Actor.system("fuzz"))
    receipt_materialize(receipt_pk=admission.receipt.pk)
    event = Event.objects.get(receipt=admission.receipt)
    generation = CredentialGeneration.objects.get(generation_id=f"{account.account_key}.webhook-signing.g1")
    return ApiWorld(account_key=account.account_key, channel=CHANNEL,
                    secret=secret_backend().read(generation.secret_version_ref), receipt_id=admission.receipt.pk,
                    epoch_id=world.active_epoch.epoch_id, epoch_digest=bytes(world.active_epoch.digest).hex(),
                    event_id=event.pk, event_digest=bytes(event.payload_digest).hex())


def row_counts() -> dict[str, int]:
    """Row count of every table of the connector, effects and cutover apps, in one statement."""
    tables = sorted(m._meta.db_table for label in ("connector", "effects", "cutover")
                    for m in apps.get_app_config(label).get_models()
                    if m._meta.managed and not m._meta.proxy and _routed_default(m))
    sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in tables)
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return dict(cursor.fetchall())


def _routed_default(model) -> bool:
    from django.db import router

    return router.db_for_write(model) == "default"
