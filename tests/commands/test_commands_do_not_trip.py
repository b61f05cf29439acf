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
