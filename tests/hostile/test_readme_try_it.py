"""README.md's "Try it" works as written (issue 41 item 6): every fenced `sh` block of the README that is not a
`make` command is run, as it stands, from the checkout against the real web process of `make run` (gunicorn, the
`web_server` fixture, on the port `PORT` names) serving the demo world that `manage.py demo_load` loads; each
delivery it sends is answered 201. The `make` blocks are checked by tests/test_docs.py (their targets exist)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.faults.servers import ROOT, child_environment, manage, run_database_env


def readme_blocks() -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    return [b for b in blocks if not all(line.startswith("make ") for line in b.strip().splitlines())]


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_every_try_it_block_of_the_readme_is_answered_201(web_server):
    """Proves: issue 41 item 6 (the README's commands run; a README command moved to a wrong port fails here)."""
    env = child_environment(secret_dir=web_server.secret_dir, PORT=str(web_server.port), **run_database_env())
    loaded = manage(env, "demo_load", "--password", "readme-try-it-1", timeout=600)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    blocks = readme_blocks()
    assert len(blocks) >= 2
    for block in blocks:
        ran = subprocess.run(["bash", "-c", block.replace(".venv/bin/python", sys.executable)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        answers = [line for line in ran.stdout.splitlines() if re.match(r"^\d{3} \{", line)]
        assert answers and all(line.startswith("201 ") for line in answers), ran.stdout + ran.stderr
