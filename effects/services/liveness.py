"""A worker process that died on this host (SIGKILL, OOM, a crash) leaves its holder generation `running` and its
open permits open: its effects stay `dispatching` until someone records that the process is gone (issue 37).
The effects sweep records it, with the evidence a supervisor would give: a `running` generation whose holder id
names this host and a process id (`<host>:<pid>:<tag>`, `worker.holder_id()`) that no longer exists here is
terminated with "process <pid> of <host> no longer exists", and each of its open permits is abandoned with that
proof (`granted` -> the effect `prepared`, never sent; `sending` -> `uncertain`, where the idempotency contract's
recovery or a person takes over).

What proves nothing, and is left alone: a process id that exists (even one the kernel reused), a generation of
another host (that host's sweeper checks it), a holder id of another shape. Elapsed time never decides. A
deployment whose processes share a host name without sharing a process namespace (containers of one pod) turns
this off with CONNECTOR_HOLDER_LIVENESS=0 and isolates through its supervisor (`manage.py holders terminate`)."""
from __future__ import annotations

import logging
import os
import re
import socket

from django.conf import settings
from django.utils import timezone

from connector.actors import Actor
from effects.choices import HolderState
from effects.models import DispatchPermit, ProcessGeneration
from effects.services import dispatch

log = logging.getLogger(__name__)
ACTOR = Actor.system("holder-liveness")
HOLDER_ID = re.compile(r"^(?P<host>.+):(?P<pid>\d+):[0-9a-f]{8}$")


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def dead_holders_isolate() -> list[str]:
    """Terminate this host's `running` generations whose process is gone and abandon their open permits; return
    the holder ids isolated."""
    if not settings.CONNECTOR.get("HOLDER_LIVENESS", True):
        return []
    host = socket.gethostname()
    isolated = []
    for holder_id in ProcessGeneration.objects.filter(state=HolderState.RUNNING, holder_id__startswith=f"{host}:") \
            .values_list("holder_id", flat=True):
        match = HOLDER_ID.match(holder_id)
        if match is None or match["host"] != host or process_exists(int(match["pid"])):
            continue
        evidence = (f"process {match['pid']} of {host} no longer exists (checked by the effects sweep, process "
                    f"{os.getpid()}, at {timezone.now().isoformat()})")
        dispatch.holder_terminate(holder_id=holder_id, evidence=evidence, actor=ACTOR)
        for pk in DispatchPermit.objects.filter(holder__holder_id=holder_id, state__in=("granted", "sending")) \
                .order_by("pk").values_list("pk", flat=True):
            effect = dispatch.permit_abandon(permit_pk=pk, actor=ACTOR)
            log.warning("permit #%s of dead holder %s abandoned: effect #%s is %s", pk, holder_id, effect.pk,
                        effect.state)
        isolated.append(holder_id)
    return isolated
