"""Shared steps of the outbound-chain tests: production-shaped authoring (the application transaction takes the
serving guard, then authors), the dispatch steps one by one, and raw-SQL probes of the PostgreSQL rules."""
from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from django.db import IntegrityError, ProgrammingError, connection, transaction

from connector.actors import Actor
from connector.models import CredentialGeneration
from connector.services.guard import lock_serving
from effects import egress
from effects import egress_batch
from effects.models import DispatchPermit, OutboundCommand, ProcessGeneration
from effects.services import dispatch
from effects.services.outbound import outbound_command_author
from tests import dbroles
from tests.support import scaled

ACTOR = Actor.system("effects-tests")
PUSH_CONTRACT = "records.push"
CALLOUT = "records.callout"


def build_push_world():
    """The demo push world (as the `push_world` fixture builds it); in a transactional test it is committed for
    real, so threads on their own connections see it."""
    from connector.demo import build_world

    return build_world("p-", push=True)


def build_keyless_push_world(monkeypatch):
    """A push world whose frozen push contract declares no provider idempotency support."""
    from connector import demo

    monkeypatch.setattr(demo, "PUSH_DEFINITION", {k: v for k, v in demo.PUSH_DEFINITION.items()
                                                   if k != "idempotency"})
    return demo.build_world("n-", push=True)


def demo_secret(generation_id: str) -> str:
    """The secret connector.demo stores for a generation (what the receiver must see as the bearer token)."""
    return hashlib.sha256(f"demo-secret:{generation_id}".encode()).hexdigest()


def outbound_generation(account) -> CredentialGeneration:
    return CredentialGeneration.objects.get(generation_id=f"{account.account_key}.crm-api.g1")


def author(account, *, root: str = "order-1", slot: str = "push:records.push", generation: str = "g1",
           record_id: str = "r1", body: dict | None = None, suppress: bool = False,
           scope: str = "runtime.records") -> OutboundCommand:
    """The application transaction: serving guard first, then the command, in one atomic block."""
    with transaction.atomic():
        ctx = lock_serving(account_id=account.pk)
        return outbound_command_author(
            ctx=ctx, account_key=account.account_key, application_scope=scope, effect_root_id=root,
            effect_slot_id=slot, effect_generation_id=generation, push_contract=PUSH_CONTRACT, callout=CALLOUT,
            # Both spellings of the callout's path placeholder; str.format ignores the unused one.
            path_params={"record_id": record_id, "record_key": record_id},
            body=body if body is not None else {"record_key": record_id, "name": "Ann"},
            suppress_external_effects=suppress)


@dataclass
class Ready:
    holder: ProcessGeneration
    claim: dispatch.EffectClaim
    permit: DispatchPermit


def claim(holder_id: str = "h1", account=None) -> tuple[ProcessGeneration, dispatch.EffectClaim | None]:
    holder = dispatch.holder_register(holder_id=holder_id)
    return holder, dispatch.effect_claim(holder=holder, account_id=account.pk if account is not None else None)


def acquire(holder_id: str = "h1", account=None) -> Ready:
    """Register the holder, claim the next prepared effect and acquire its permit (each its own transaction)."""
    holder, c = claim(holder_id, account)
    assert c is not None, "nothing claimable"
    return Ready(holder, c, dispatch.permit_acquire(claim=c))


def send(ready: Ready, *, holder_id: str | None = None, holder_fence: int | None = None,
         credential_gate_fence: int | None = None):
    p = ready.permit
    return egress_batch.send(permit_pk=p.pk, holder_id=holder_id or ready.holder.holder_id,
                       holder_fence=p.holder_fence if holder_fence is None else holder_fence,
                       credential_gate_fence=(p.credential_gate_fence if credential_gate_fence is None
                                              else credential_gate_fence))


def revoke(generation_id: str, fence: int | None = None, reason: str = "key leaked"):
    from connector.services.gates import credential_gate_transition

    return credential_gate_transition(generation_id=generation_id, action="revoke", expected_fence=fence,
                                      actor=ACTOR, reason=reason)


def reenable(generation_id: str, fence: int | None = None):
    from connector.services.gates import credential_gate_transition

    return credential_gate_transition(generation_id=generation_id, action="reenable", expected_fence=fence,
                                      actor=ACTOR, reason="rotation verified by security")


def gate_action(account, action: str):
    from connector.services.gates import gate_transition

    return gate_transition(account_id=account.pk, action=action, expected_fence=None, actor=ACTOR,
                           reason="test")


# -- raw SQL around the services -------------------------------------------------------------------------------

def force(sql: str, params) -> None:
    """Put a row into an arbitrary state with this session's triggers off, the way a corrupt or legacy row could
    exist (superuser session). Only sets up a source state; the probe itself runs with triggers on."""
    with connection.cursor() as cursor:
        dbroles.admin_on(cursor)
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = origin")
            dbroles.admin_off(cursor)


def refused_by(sql: str, params) -> str | None:
    """Run one statement in a savepoint. Returns None if PostgreSQL accepted it, else the refusing constraint.
    Where the application role holds no privilege for the statement at all (an append-only table), it runs again
    as the administrator: the rule probed is the one that refuses every role (the trigger or constraint)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
        return None
    except IntegrityError as exc:
        return exc.__cause__.diag.constraint_name
    except ProgrammingError as exc:
        if "permission denied" not in str(exc):
            raise
    with dbroles.as_admin("default"):
        return refused_by(sql, params)


def waiting_here() -> int:
    """Sessions of this test database currently waiting for a lock (other suites on the server are ignored)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                       "WHERE NOT l.granted AND a.datname = current_database()")
        return cursor.fetchone()[0]


class SimulatedCrash(Exception):
    """Raised at a product fault point instead of SIGKILL: the process 'dies' there, nothing after it runs."""


def crash_at(monkeypatch, module, point: str) -> None:
    """Make `module.fault_point(point)` raise SimulatedCrash (the product's crash points SIGKILL the process)."""
    original = module.fault_point

    def fault(name: str) -> None:
        if name == point:
            raise SimulatedCrash(point)
        original(name)

    monkeypatch.setattr(module, "fault_point", fault)


class Gate:
    """A one-shot pause point for a thread: `reached` is set when the thread arrives, it waits for `go`."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def pause(self) -> None:
        self.reached.set()
        assert self.go.wait(scaled(15)), "the test never released the paused thread"
