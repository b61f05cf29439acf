"""Real process crashes: a child Python process runs one service against the committed test database and is
SIGKILLed by connector.faults at a named crash point; the test then recovers and checks the seed's rule
("Transaction and crash rules")."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import dbroles
from tests.support import scaled

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 60

PRELUDE = """\
import json, os, sys
import django
django.setup()
ARGS = json.loads(os.environ["CRASH_CHILD_ARGS"])
def emit(**values):
    print("CHILD-RESULT " + json.dumps(values), flush=True)
"""


def _url(settings_dict: dict, name: str) -> str:
    user = settings_dict.get("USER") or "postgres"
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{password}" if password else user
    return f"postgres://{auth}@{settings_dict.get('HOST') or '127.0.0.1'}:{settings_dict.get('PORT') or 5432}/{name}"


@dataclass
class ChildRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def result(self) -> dict:
        for line in self.stdout.splitlines():
            if line.startswith("CHILD-RESULT "):
                return json.loads(line[len("CHILD-RESULT "):])
        raise AssertionError(f"child printed no result:\n{self.stdout}\n{self.stderr}")


@pytest.fixture
def child_env(settings):
    """The environment of a child process bound to this test's databases and secret backend directory."""
    from django.db import connections

    default = connections["default"].settings_dict
    journal = connections["journal"].settings_dict
    assert default["NAME"] == default["TEST"]["NAME"], "the test database is not set up"
    env = {k: v for k, v in os.environ.items() if k not in ("CONNECTOR_FAULT_POINT", "DATABASE_URL",
                                                            "JOURNAL_DATABASE_URL")}
    env.update({
        "DJANGO_SETTINGS_MODULE": "config.django.test",
        "DATABASE_URL": _url(default, default["NAME"]),
        "JOURNAL_DATABASE_URL": _url(journal, journal["TEST"]["NAME"]),
        "CONNECTOR_SECRET_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        **dbroles.child_env(),  # the child runs as the application role, like the worker it stands for
    })
    return env


@pytest.fixture
def run_child(child_env):
    """run_child(script, fault_point=None, **args): run `script` after django.setup() in a fresh interpreter,
    with ARGS = args (JSON) and `emit(**values)` to report back; with a fault point, the named crash point
    SIGKILLs the child."""

    def run(script: str, fault_point: str | None = None, **args) -> ChildRun:
        env = dict(child_env, CRASH_CHILD_ARGS=json.dumps(args))
        if fault_point:
            env["CONNECTOR_FAULT_POINT"] = fault_point
        proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(script)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=scaled(CHILD_TIMEOUT), check=False)
        return ChildRun(proc.returncode, proc.stdout, proc.stderr)

    return run
