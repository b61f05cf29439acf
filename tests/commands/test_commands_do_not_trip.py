"""Commands a newcomer tries first answer plainly (issue 41 item 7): `manage.py bench --help` prints its help,
`manage.py cutover status` on a fresh install says no cutover has started (exit 0), `manage.py delivery errors`
prints its table with a header row."""
from __future__ import annotations

import pytest
from django.core.management import call_command

from tests.faults.servers import child_environment, manage


def test_bench_help_prints_every_subcommand_without_a_traceback(tmp_path):
    """A `%` in a subcommand's help (\"overhead <= 5%\") crashed argparse's formatter. Proves: issue 41 item 7."""
    shown = manage(child_environment(secret_dir=str(tmp_path)), "bench", "--help")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "overhead" in shown.stdout and "Traceback" not in shown.stderr


@pytest.mark.django_db(databases=["default", "journal"])
def test_cutover_status_on_a_fresh_install_says_no_cutover_has_started(capsys):
    """No attempt yet: a sentence saying so and how one begins, exit 0 (it was `CommandError: no service cutover
    attempt`, exit 1). Proves: issue 41 item 7."""
    call_command("cutover", "status")
    out = capsys.readouterr().out
    assert "No cutover has started" in out and "cutover open" in out


@pytest.mark.django_db(databases=["default", "journal"])
def test_delivery_errors_prints_a_header_row(capsys):
    """The error catalog's table starts with its column names, and every row has the code first. Proves: issue 41
    item 7."""
    call_command("delivery", "errors")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["code", "exit", "class"], lines[:2]
    assert len(lines) > 5


def test_manage_py_finds_the_checkouts_services_env_by_itself(tmp_path):
    """Without DATABASE_URL in the environment, `manage.py` reads `.data/services.env` (here a stand-in file named
    by CONNECTOR_SERVICES_ENV) instead of silently using whatever listens on 127.0.0.1:5432; a DATABASE_URL that
    is set wins. Proves: issue 41 item 7."""
    import os
    import subprocess
    import sys

    from tests.faults.servers import ROOT

    services = tmp_path / "services.env"
    services.write_text("# written by scripts/services.py ensure\n"
                        "export DATABASE_URL=postgres://connector_app@127.0.0.1:5999/from_services_env\n"
                        "export JOURNAL_DATABASE_URL=postgres://connector_app@127.0.0.1:5999/journal_from_env\n")
    probe = "from django.conf import settings; print(settings.DATABASES['default']['NAME'])"
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOURNAL_DATABASE_URL",
                                                             "DJANGO_SETTINGS_MODULE", "TEST_DB_SUFFIX")}

    def name(**env: str) -> str:
        run = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c", probe], cwd=tmp_path,
                             env={**base, "CONNECTOR_SERVICES_ENV": str(services), **env}, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout.strip().splitlines()[-1]

    assert name() == "from_services_env"
    assert name(DATABASE_URL="postgres://connector_app@127.0.0.1:5999/given") == "given"


def test_bench_runs_as_the_administrator_named_in_services_env(tmp_path):
    """`manage.py bench ...` started as the application role (what a bare `manage.py` gets from .data/services.env)
    re-runs itself as DATABASE_ADMIN_URL, which may create the throwaway databases, and says so; before, it ended
    in `permission denied to create database`. Here the administrator's URL points at a port nothing listens on,
    so the re-run's own connection attempt is what fails: proof that it ran as the administrator. Proves: issue 41
    item 7."""
    import os
    import subprocess
    import sys

    from tests.faults.servers import ROOT, free_port

    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "TEST_DB_SUFFIX")}
    env.update(DATABASE_URL="postgres://connector_app@127.0.0.1:5432/connector",
               DATABASE_ADMIN_URL=f"postgres://postgres@127.0.0.1:{free_port()}/connector")
    run = subprocess.run([sys.executable, str(ROOT / "manage.py"), "bench", "history", "--sizes", "10",
                          "--iterations", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "running as DATABASE_ADMIN_URL" in run.stderr, run.stderr[-2000:]
    assert run.returncode != 0, run.stderr[-2000:]
    assert "Connection refused" in run.stderr or "connection failed" in run.stderr, run.stderr[-2000:]


def test_make_run_checks_its_ports_first_and_names_the_variable_that_moves_each(tmp_path):
    """`make run`'s first step (`run.py --check-ports`, before the install and the migrations) refuses a taken web
    or demo receiver port in a second, naming PORT or DEMO_RECEIVER_PORT; free ports pass. Before, a taken 8900
    ended in `OSError: [Errno 98] Address already in use` after minutes of setup. Proves: issue 41 item 7."""
    import os
    import socket
    import subprocess
    import sys

    from tests.faults.servers import ROOT, free_port

    def check(**ports: int) -> subprocess.CompletedProcess:
        env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "run.py"), "--check-ports"], env=env,
                              capture_output=True, text=True, timeout=30)

    web, receiver = free_port(), free_port()
    assert check(PORT=web, DEMO_RECEIVER_PORT=receiver).returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", receiver))
        taken.listen()
        refused = check(PORT=web, DEMO_RECEIVER_PORT=receiver)
        assert refused.returncode == 2 and "DEMO_RECEIVER_PORT=" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        refused = check(PORT=receiver, DEMO_RECEIVER_PORT=web)
        assert refused.returncode == 2 and "PORT=" in refused.stderr and "DEMO_RECEIVER" not in refused.stderr


def test_make_run_announces_the_admin_only_once_readyz_answers_200():
    """The supervisor prints "Admin: ..." when `/readyz` answers 200, not when the port first accepts (gunicorn
    listens about 20 s before its workers can answer; the README's first send then timed out). Proves: issue 41
    item 7."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from scripts.run import Supervisor

    status = {"code": 503}

    class Readyz(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status["code"] if self.path == "/readyz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Readyz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        supervisor = Supervisor(server.server_address[1])
        assert supervisor.web_ready() is False  # the port accepts, the app is not ready
        status["code"] = 200
        assert supervisor.web_ready() is True
    finally:
        server.shutdown()
        server.server_close()
