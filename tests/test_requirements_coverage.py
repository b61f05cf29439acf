"""Every requirement of the Connector V2 index is either proven by a test that names it in its docstring
(`Proves: <ID>`), or listed as not applicable, with why and what stands in its place, in the D-212 entry of the
decision record (docs/decisions/testing.md), or listed below in KNOWN_GAPS with its reason and issue. The index's
IDs are vendored in docs/requirement-ids.txt so the check runs from a clean clone; when the shared spec sits beside
the repository (`../shared/spec/`), the vendored list must equal it. Pure file reads: no database."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENDORED = ROOT / "docs" / "requirement-ids.txt"
SHARED_INDEX = ROOT.parent / "shared" / "spec" / "connector-v2-requirements.md"
DECISIONS = ROOT / "docs" / "decisions"
NOT_APPLICABLE_ENTRY = "D-212"
ID = re.compile(r"CV2-\d{2}-\d{3}")

# The debt, named (D-213): an ID that is open, with why and the issue that closes it. Empty since issue 22 closed the
# last real gaps _R1.._R19 (D-267, D-284, D-290, D-291, D-300..D-331): every requirement is now cited by a test
# docstring or justified in D-212. A new entry needs its reason and issue; the check fails on an entry that is also
# cited or justified.
KNOWN_GAPS: dict[str, tuple[str, int]] = {}


def requirement_ids() -> list[str]:
    lines = [line for line in VENDORED.read_text().splitlines() if line and not line.startswith("#")]
    return [ID.match(line).group(0) for line in lines]


def cited_ids(root: Path = ROOT / "tests") -> dict[str, list[str]]:
    """ID -> the tests (path::name) whose docstring names it. Only docstrings count: a comment or a string in a
    test body is not a claim that the test proves the requirement."""
    cited: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                name = getattr(node, "name", "<module>")
                for found in ID.findall(doc):
                    cited.setdefault(found, []).append(f"{path.relative_to(root.parent).as_posix()}::{name}")
    return cited


def not_applicable(text: str | None = None) -> dict[str, str]:
    """ID -> justification, from the bullets of the D-212 entry: `- CV2-AA-NNN: why ... In its place: ...`."""
    text = "\n".join(page.read_text() for page in sorted(DECISIONS.glob("*.md"))) if text is None else text
    start = text.index(f"\n{NOT_APPLICABLE_ENTRY}. ")
    end = re.search(r"\n(D-\d+\. |## )", text[start + 1:])
    entry = text[start:start + 1 + end.start()] if end else text[start:]
    found = {}
    for match in re.finditer(r"^- `?(CV2-\d{2}-\d{3})`?: (.+?)(?=^- |\Z)", entry, re.S | re.M):
        found[match.group(1)] = " ".join(match.group(2).split())
    return found


def test_vendored_ids_are_the_index():
    """The vendored list holds each ID once, in order, and equals the shared index when it is present."""
    ids = requirement_ids()
    assert len(ids) == len(set(ids)) == 482 and ids == sorted(ids)
    if not SHARED_INDEX.exists():
        pytest.skip(f"{SHARED_INDEX} is not beside this clone; the vendored list stands")
    shared = re.findall(r"^- (CV2-\d{2}-\d{3}) ", SHARED_INDEX.read_text(), re.M)
    assert ids == shared


def test_every_justification_says_why_and_what_stands_in_its_place():
    """A not-applicable entry names an ID of the index, says why, and names what stands in its place."""
    ids = set(requirement_ids())
    entries = not_applicable()
    assert entries, f"the {NOT_APPLICABLE_ENTRY} entry of docs/decisions/ lists no ID"
    for rid, why in entries.items():
        assert rid in ids, f"{rid} is not a requirement ID"
        assert "In its place:" in why and len(why.split("In its place:")[0].split()) >= 5, rid


def test_lists_do_not_overlap_or_name_unknown_ids():
    """An ID is cited, justified or a known gap: never two of them (a proven ID is not also excused), and every
    listed ID exists."""
    ids = set(requirement_ids())
    cited, justified, gaps = set(cited_ids()) & ids, set(not_applicable()), set(KNOWN_GAPS)
    assert set(cited_ids()) - ids == set(), "a test cites an ID the index does not have"
    assert gaps <= ids
    assert cited & justified == set(), "cited by a test and also listed as not applicable"
    assert cited & gaps == set(), "proven by a test: remove it from KNOWN_GAPS"
    assert justified & gaps == set()
    for rid, (reason, issue) in KNOWN_GAPS.items():
        assert reason.strip() and issue > 0, rid


def test_every_requirement_is_cited_or_justified():
    """Every requirement ID is named by a test docstring, justified as not applicable in D-212, or a declared
    known gap; the failure names every ID that is none of these."""
    accounted = set(cited_ids()) | set(not_applicable()) | set(KNOWN_GAPS)
    missing = [rid for rid in requirement_ids() if rid not in accounted]
    assert missing == [], f"{len(missing)} requirement IDs are neither cited nor justified: {' '.join(missing)}"


def test_the_check_can_fail(tmp_path):
    """The scanners find what they should and nothing else: a docstring citation counts, a comment or a body
    string does not; a justification bullet is read from its own entry only."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_x.py").write_text(
        'def test_a():\n    """Proves: CV2-99-001"""\n    x = "CV2-99-002"  # CV2-99-003\n')
    assert cited_ids(tests) == {"CV2-99-001": ["tests/test_x.py::test_a"]}
    text = ("# Decisions\n\nD-211. other.\n- CV2-99-004: not this one. In its place: nothing at all here.\n\n"
            "D-212. **Not applicable.**\n- CV2-99-005: why it does not apply here. In its place: the thing.\n"
            "- `CV2-99-006`: another reason that is long enough. In its place: more.\n\nD-213. next.\n"
            "- CV2-99-007: after. In its place: x.\n")
    assert set(not_applicable(text)) == {"CV2-99-005", "CV2-99-006"}
