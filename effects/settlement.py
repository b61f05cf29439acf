"""No stranded settlement (issue 37 item 3, decisions D-424..D-426): the egress process's answer is written, or its
holder generation is given up.

- `until_landed`: a settlement (`permit_settle`, `permits_settle_confirmed`) that PostgreSQL cannot take now (a
  lost connection, a server restarting, a lock or statement timeout: `OperationalError` / `InterfaceError`) is
  tried again, with exponential backoff from SETTLE_RETRY_FIRST_SECONDS to SETTLE_RETRY_MAX_SECONDS, for as long as
  the process lives. Each try is the whole settlement transaction again: the permit is still `sending` under its
  lock, or the try is refused (PermitRefused) and nothing is written twice. Once the database is back, the answer
  lands within one backoff interval.
- If the settlement keeps failing transiently for CONNECTOR["SETTLE_GIVE_UP_SECONDS"] (default 60) while the
  database answers otherwise, and whenever a worker step leaves one of its own permits open after a transient
  failure (its sending marker or its send failed with the database, so the process cannot tell whether the marker
  committed), the process gives up its holder generation (`give_up`): tried again the same way until it lands,
  one transaction terminates the generation with that evidence (`holder_terminate`) and each of its open permits
  is abandoned with the proof (`permit_abandon`: `granted` -> the effect `prepared`, never counted; `sending` -> the
  effect `uncertain` with the abandonment evidence). The worker then takes a new generation (`worker.holder_id`).

A process killed while it holds an answer leaves a `running` generation behind: the crash rules apply (terminate it
with evidence, then abandon its permits)."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from connector import stage_metrics
from connector.actors import Actor
from effects.models import DispatchPermit
from effects.services import dispatch

log = logging.getLogger(__name__)
T = TypeVar("T")
LOST = (OperationalError, InterfaceError)
GIVER = Actor.system("egress")
_GIVEN_UP: set[str] = set()  # holder generations this process gave up: never used again by it


def _knob(name: str, default: float) -> float:
    return float(settings.CONNECTOR.get(name, default))


def _reconnect() -> None:
    """Drop the broken connection (outside any transaction) so the next try opens a new one."""
    if not connection.in_atomic_block:
        try:
            connection.close()
        except LOST:  # noqa: PERF203 - closing a dead connection may itself fail; the next try reconnects
            pass


def _again(call: Callable[[], T], *, what: str, give_up_after: float | None) -> T:
    """`call()` until it returns, retrying LOST failures with backoff; after `give_up_after` seconds of failures (None:
    never) the last failure is raised."""
    delay, began = _knob("SETTLE_RETRY_FIRST_SECONDS", 0.25), time.monotonic()
    tries = 0
    while True:
        try:
            return call()
        except LOST as exc:
            tries += 1
            waited = time.monotonic() - began
            if give_up_after is not None and waited >= give_up_after:
                raise
            stage_metrics.settlement_retried(step=what.split(" ")[0])
            log.warning("%s not written (try %d, %.1f s): %s: %s; trying again in %.2f s", what, tries, waited,
                        type(exc).__name__, str(exc).strip()[:200], delay)
            _reconnect()
            time.sleep(delay)
            delay = min(delay * 2, _knob("SETTLE_RETRY_MAX_SECONDS", 5.0))


def until_landed(call: Callable[[], T], *, permit_pk: int, holder_id: str) -> T:
    """The settlement `call()`, tried again until it lands (see the module). After SETTLE_GIVE_UP_SECONDS of
    transient failures the holder generation is given up (`give_up`) and the last failure raised."""
    try:
        return _again(call, what=f"settlement of permit #{permit_pk}", give_up_after=_knob("SETTLE_GIVE_UP_SECONDS", 60))
    except LOST as exc:
        give_up(holder_id, evidence=f"the settlement of permit #{permit_pk} could not be written for "
                                    f"{_knob('SETTLE_GIVE_UP_SECONDS', 60):.0f} s ({type(exc).__name__})")
        raise


def give_up(holder_id: str, *, evidence: str) -> list[int]:
    """Give up this process's holder generation (see the module): from now on the process never sends under it,
    and, tried again until PostgreSQL takes it, the generation is terminated with `evidence` and each of its open
    permits abandoned with the proof. Returns the effects whose permits were abandoned."""
    _GIVEN_UP.add(holder_id)
    evidence = f"egress process gave up its generation: {evidence}"
    log.warning("holder generation %s given up: %s", holder_id, evidence)

    def terminate() -> list[int]:
        dispatch.holder_terminate(holder_id=holder_id, evidence=evidence, actor=GIVER)
        pks = DispatchPermit.objects.filter(holder__holder_id=holder_id, state__in=("granted", "sending")) \
            .order_by("pk").values_list("pk", flat=True)
        return [dispatch.permit_abandon(permit_pk=pk, actor=GIVER).pk for pk in pks]

    return _again(terminate, what=f"give-up of holder generation {holder_id}", give_up_after=None)


def given_up(holder_id: str) -> bool:
    return holder_id in _GIVEN_UP
