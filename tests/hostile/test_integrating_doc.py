"""docs/integrating.md works as written (issue 41 items 5 and 6): every fenced block of the page (sh, python, js) is
run, as it stands in the page, against the real web process of `make run` (gunicorn, the `web_server` fixture)
serving the demo world loaded by `manage.py demo_load`: the secret printed by the page's command is the account's,
each of the three signed deliveries is answered 201, and the receipt reads answer the receipt. A page whose command
moved to a wrong port, a renamed path or a broken signature recipe fails here."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.servers import ROOT, child_environment, manage, run_database_env

PAGE = ROOT / "docs" / "integrating.md"
PASSWORD = "integrating-doc-password-1"


def blocks(language: str) -> list[str]:
    return [b for lang, b in re.findall(r"^ *```(\w+)\n(.*?)^ *```", PAGE.read_text(), re.S | re.M) if lang == language]


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.django_db(transaction=True, databases=["default", "journal"])
def test_every_block_of_the_integrating_page_runs_against_the_real_web_process(web_server, settings, tmp_path):
    """Proves: issue 41 item 5 (sign in three languages, read a receipt) and item 6 (the page's commands run)."""
    child = child_environment(secret_dir=web_server.secret_dir, **run_database_env())
    loaded = manage(child, "demo_load", "--password", PASSWORD, timeout=600)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    sh, python, js = blocks("sh"), blocks("python"), blocks("js")
    assert len(sh) == 3 and len(python) == 1 and len(js) == 1, (len(sh), len(python), len(js))

    printed = run(["bash", "-c", sh[0].strip().replace(".venv/bin/python", sys.executable)], child)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    secret = printed.stdout.strip().splitlines()[-1]
    settings.CONNECTOR = {**settings.CONNECTOR, "SECRET_BACKEND_DIR": web_server.secret_dir}
    from connector.models import CredentialGeneration
    from connector.secrets import secret_backend

    assert secret.encode() == secret_backend().read(CredentialGeneration.objects.get(
        generation_id="acme-eu.webhook-signing.g1").secret_version_ref)

    env = {**os.environ, "BASE": f"http://127.0.0.1:{web_server.port}", "SECRET": secret}
    script = tmp_path / "send.py"
    script.write_text(python[0])
    node = tmp_path / "send.js"
    node.write_text(js[0])
    answers = {"curl": run(["bash", "-c", sh[1]], env), "python": run([sys.executable, str(script)], env),
               "node": run(["node", str(node)], env)}
    receipts = []
    for name, answer in answers.items():
        assert answer.returncode == 0, (name, answer.stdout, answer.stderr)
        text = answer.stdout.strip()
        receipt = json.loads(text[text.index("{"):])
        assert receipt["admission"] == "created", (name, text)
        assert name == "curl" or text.startswith("201 "), (name, text)
        receipts.append(receipt["receipt"])
    assert len(set(receipts)) == 3

    reads = run(["bash", "-c", sh[2]], {**env, "READER": "ann", "READER_PASSWORD": PASSWORD,
                                        "RECEIPT": str(receipts[0])})
    assert reads.returncode == 0, reads.stdout + reads.stderr
    receipt_json, events_json = reads.stdout.replace("}{", "}\n{", 1).split("\n", 1)
    receipt = json.loads(receipt_json)
    assert (receipt["id"], receipt["account"], receipt["channel"]) == (receipts[0], "acme-eu", "records.webhook")
    assert json.loads(events_json), events_json
