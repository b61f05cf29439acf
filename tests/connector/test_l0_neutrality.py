"""L0 carries no provider literals or branches: the conformance packs' names, event vocabulary, source field
names and JSON pointers occur nowhere in connector/, effects/ or cutover/ code (connector/demo.py is demo L1/L2
data and is excluded, as are migrations). The scanner is tested against a planted violation so it can fail."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conformance.packs import CONFORMANCE_PACKS, EVENT_VOCABULARY, pack_literals

ROOT = Path(__file__).resolve().parents[2]
L0_PACKAGES = ("connector", "effects", "cutover")
EXCLUDED = {"connector/demo.py"}
# L0's own entity vocabulary that a pack may also use as a source name: "events" is L0's Event relation name
# (`related_name="events"`). Pack A's use of it is still checked in its pointer form "/events".
L0_VOCABULARY = {"events"}
# A pointer starts a string or follows a quote, space or bracket; inside a URL path (`<int:pk>/events`) the same
# characters are a REST route of L0's own API, not a JSON pointer.
POINTER_START = r"(?:^|(?<=[\s\"'(\[{,:=]))"
# Files once found to carry a pack literal, each with its finding; `test_fixed_finding_stays_fixed` proves every
# one is still free of them. A new finding is fixed, not exempted: the scan of L0 has no exemption list.
FIXED_FINDINGS = {
    "bench/management/commands/bench.py": (
        "hard-coded the demo pack's route name and built the demo body fields itself (when it lived in L0); the "
        "traffic shapes now come from connector/demo.py (commit 636bd9f) and the bench is its own app (D-200)"),
}


def l0_files() -> list[Path]:
    files = []
    for package in L0_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "migrations" in path.parts or relative in EXCLUDED:
                continue
            files.append(path)
    return files


def literal_sets() -> tuple[set[str], set[str], set[str]]:
    """(distinctive names, plain words, pointers) of both packs. A distinctive name contains `_`, `.` or `-`
    and may not occur anywhere in a file, comments and docstrings included; a plain word (e.g. `seq`) may not
    be a code string literal or a token of one; a pointer may not occur inside any code string literal."""
    names, pointers = set(), set()
    for pack in CONFORMANCE_PACKS:
        n, p = pack_literals(pack)
        names |= n
        pointers |= p
    names |= set(EVENT_VOCABULARY)
    distinctive = {n for n in names if re.search(r"[_.\-]", n)}
    plain = names - distinctive - L0_VOCABULARY
    return distinctive, plain, pointers


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def violations(source: str, label: str) -> list[str]:
    distinctive, plain, pointers = literal_sets()
    found = []
    for name in sorted(distinctive):
        if re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"(?![A-Za-z0-9_])", source):
            found.append(f"{label}: provider name {name!r}")
    tree = ast.parse(source)
    docstrings = _docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            tokens = set(re.findall(r"[A-Za-z0-9_]+", node.value))
            found += [f"{label}:{node.lineno}: field name {w!r} in {node.value[:60]!r}" for w in sorted(plain & tokens)]
            found += [f"{label}:{node.lineno}: pointer {p!r} in {node.value[:60]!r}" for p in sorted(pointers)
                      if re.search(POINTER_START + re.escape(p) + r"(?![A-Za-z0-9_])", node.value)]
    return found


def test_l0_has_no_conformance_pack_literals():
    """No pack, route, mapping, credential, Runtime-command or event name, no source field name and no JSON
    pointer of either conformance pack occurs in L0 code; connector/demo.py is the only L1 data in the tree.
    Proves: CV2-02-003, CV2-02-005, CV2-06-007"""
    files = l0_files()
    assert len(files) > 30 and any(f.name == "inbound.py" and f.parent.name == "interpreters" for f in files)
    found = [v for path in files for v in violations(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert found == []


@pytest.mark.parametrize("relative", sorted(FIXED_FINDINGS))
def test_fixed_finding_stays_fixed(relative):
    """Each file once found to carry a pack literal still exists (a moved or deleted file must be re-pointed
    here, not silently skipped) and carries none. Proves: CV2-02-003"""
    path = ROOT / relative
    assert path.is_file(), f"{relative} moved: point FIXED_FINDINGS at its new home"
    assert violations(path.read_text(), relative) == []


@pytest.mark.parametrize("planted", [
    'def normalize(c):\n    return resolve_pointer(c, "/record_id")\n',
    'def route(kind):\n    if kind == "ledger.line":\n        return 1\n',
    'def pick(component):\n    return component["seq"]\n',
    'OWNER = "acme-hooks"\n',
    'def items(doc):\n    return resolve_pointer(doc, "/events")\n',
    '# a comment naming ledger.sequenced is still a provider literal\nX = 1\n',
    'def f(doc):\n    return doc.get("attributes", {}).get("mail")\n',
])
def test_scanner_finds_a_planted_provider_literal(planted):
    """The scan is not vacuous: a provider pointer, event-kind branch, field lookup, pack name or route name
    planted in L0-shaped code is reported. Proves: CV2-02-003"""
    assert violations(planted, "planted.py") != []


def test_scanner_ignores_generic_l0_vocabulary():
    """Generic L0 words that merely contain a field name (`strict_source_sequence`, a docstring saying
    "sequence") are not violations, so the scan has no false alarm to silence. Proves: CV2-02-003"""
    source = ('"""An ordered sequence of records."""\n'
              'CONTRACT = "strict_source_sequence"\n'
              'URL = "v2/receipts/<int:pk>/events"\n'
              'def events(account):\n    return account.events.all()\n')
    assert violations(source, "generic.py") == []
