"""Hypothesis keeps its caches (example database, constants) outside the work tree: nothing of a run lands in git
status. Schemathesis uses Hypothesis too. `web_server`: the real web process, as `make run` serves it."""
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from tests.faults.servers import (
    Child,
    child_environment,
    free_port,
    manage,
    run_database_env,
    wait_http,
    wait_web_workers,
    web_child,
)

set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "connector-v2-hypothesis")


# -- the real web process -------------------------------------------------------------------------------------------


@dataclass
class WebServer:
    """The web process as `make run` serves it: gunicorn with config/gunicorn.py on a spare loopback port, bound
    to this run's test databases, with its own secret directory and collected static files."""

    port: int
    child: Child
    secret_dir: str

    def worker_pids(self) -> list[int]:
        """The processes that serve requests: gunicorn's workers (the master's children), or the server process
        itself when it has none (runserver)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == self.child.proc.pid:
                    pids.append(int(entry))
        return pids or [self.child.proc.pid]


@pytest.fixture(scope="package")
def web_server(django_db_setup, tmp_path_factory):
    """One web process for the tests of this package, stopped after the last of them."""
    root = tmp_path_factory.mktemp("web-server")
    env = child_environment(secret_dir=str(root / "secrets"), REDIS_URL="redis://127.0.0.1:1/0",
                            DJANGO_STATIC_ROOT=str(root / "static"), **run_database_env())
    collected = manage(env, "collectstatic", "--noinput", "-v", "0")  # as `make run` does before starting it
    assert collected.returncode == 0, collected.stdout + collected.stderr
    port = free_port()
    web = web_child(env, port, root).start()
    try:
        wait_http(port, 90, web.proc)
        wait_web_workers(web)
        yield WebServer(port, web, str(root / "secrets"))
    finally:
        web.stop()
