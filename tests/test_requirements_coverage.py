"""Every requirement of the Connector V2 index is either proven by a test that names it in its docstring
(`Proves: <ID>`), or listed as not applicable, with why and what stands in its place, in the D-212 entry of
docs/decisions.md, or listed below in KNOWN_GAPS with its reason and issue. The index's IDs are vendored in
docs/requirement-ids.txt so the check runs from a clean clone; when the shared spec sits beside the repository
(`../shared/spec/`), the vendored list must equal it. Pure file reads: no database."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENDORED = ROOT / "docs" / "requirement-ids.txt"
SHARED_INDEX = ROOT.parent / "shared" / "spec" / "connector-v2-requirements.md"
DECISIONS = ROOT / "docs" / "decisions.md"
NOT_APPLICABLE_ENTRY = "D-212"
ID = re.compile(r"CV2-\d{2}-\d{3}")

# The debt, named (D-213). Each entry: why the ID is open and the issue that closes it. _R1.._R19 are real gaps
# (_R1 was closed by D-284, _R3 by D-290, _R6 by D-267, _R17 by D-291) the product does not show yet, each saying precisely what is missing
# (issue 22 triaged every ID: none is left unread). Remove an entry when a test proves the ID: the check fails on
# an entry that is also cited or justified.
_R2 = ("no crash test at every barrier boundary of the first-activation coordinator proving one holder-"
       "fenced takeover of the same set and CutoverDecision, and stale acquire/release refused")
_R4 = ("no operator-authorized intentional new remote call that reconciles predecessor RemoteEffects of "
       "the same EffectRootID and EffectSlotID (resume, reject, block, successor EffectGenerationID only "
       "after proven no_effect)")
_R5 = ("the readiness certificate gives each route a disposition, but its conformance proof attachment, "
       "the v1_high_water evidence rules, the unsupported-route disabling generation and the "
       "revalidation at baseline capture are not proven per requirement")
_R7 = ("REST bulk delivery keeps its own operation model beside OutboundCommand/RemoteEffect; whether "
       "that meets 'one effect model' needs a decision")
_R8 = ("a route's order_independent contract is accepted on the pack definition's word: no conformance proof "
       "that its operations commute (or cannot overwrite newer source state) is attached to the definition, "
       "checked at epoch verification, or required when a successor gives such a route no lane handoff "
       "(order-independent routes simply get no lane and so no handoff)")
_R9 = ("the cutover preflight refuses a route whose V1 owner declares it unsupported "
       "(tests/cutover/test_v1_shutdown.py), but it takes the declared disposition as given and only records "
       "the proof digest: it does not itself check the order-independent proof or the completeness of the "
       "route's source-order facts")
_R10 = ("a replay's predecessor ref can name only a V2 Event (its ID and payload digest, with reason, principal "
        "and the replay protocol); there is no form of it that carries V1 Receipt/Event/WorkItem identities, "
        "the original (V1) epoch or a result digest, so a V1 predecessor, and the rule that its epoch is "
        "evidence only, cannot be expressed")
_R11 = ("a replay authors no outbound command at all (suppress_external_effects; "
        "tests/connector/test_api_replay_dispositions.py), so it never mints an EffectGenerationID; but nothing "
        "carries the predecessor's EffectRootID into the replay's records for correlation (the root is derived "
        "from the Runtime command ID, which a replay changes)")
_R12 = ("a planned successor halts every gate (v2_serving -> halting_v2 -> v2_halted) and finishes predecessor "
        "work by local finalization in v2_halted (tests/cutover/test_succession.py); there is no phase that "
        "first drains continuation work under the still-active predecessor with gates v2_serving while owner "
        "barriers refuse new roots")
_R14 = ("no closed inventory of the V2 paths (route, partition, account, gate, ingress, replay, "
        "materialization, claim, execution, outbound, dispatch) with the authority selected for each is built "
        "or checked before activation; the guarantee rests on every such path taking the one serving guard "
        "(tests/connector/test_validating_refuses_writes.py), not on an inventory whose uncovered path blocks "
        "activation")
_R18 = ("the first activation transaction itself moves every gate to v2_serving, which is what opens admission, "
        "claims and provider I/O; the exact readback runs after that commit and gates only v2_committed and the "
        "set's release (tests/cutover/test_first_activation.py), so provider I/O is not held back until the "
        "readback")
_R19 = ("one nonreleased barrier set per predecessor epoch (and per first-activation successor) is enforced by "
        "partial unique indexes, but a held set freezes one combined owner-receipts digest (the configuration, "
        "binding and credential proofs; the Catalog receipt only through the epoch), not one fenced receipt per "
        "owner (Catalog, each binding-definition owner, L2 configuration owner, credential authority)")
KNOWN_GAPS: dict[str, tuple[str, int]] = {
    # reason 2
    "CV2-11-043": (_R2, 22), "CV2-11-056": (_R2, 22),
    # reason 4
    "CV2-09-020": (_R4, 22), "CV2-09-021": (_R4, 22), "CV2-09-022": (_R4, 22), "CV2-09-023": (_R4, 22),
    "CV2-09-024": (_R4, 22),
    # reason 5
    "CV2-06-018": (_R5, 22), "CV2-06-019": (_R5, 22), "CV2-06-021": (_R5, 22), "CV2-06-022": (_R5, 22),
    "CV2-06-023": (_R5, 22), "CV2-06-024": (_R5, 22), "CV2-06-026": (_R5, 22), "CV2-06-028": (_R5, 22),
    # reason 7
    "CV2-10-046": (_R7, 22),
    # reason 8
    "CV2-06-003": (_R8, 22), "CV2-11-017": (_R8, 22),
    # reason 9
    "CV2-06-008": (_R9, 22),
    # reason 10
    "CV2-09-002": (_R10, 22), "CV2-09-014": (_R10, 22),
    # reason 11
    "CV2-09-019": (_R11, 22),
    # reason 12
    "CV2-11-005": (_R12, 22),
    # reason 14
    "CV2-12-010": (_R14, 22),
    # reason 18
    "CV2-12-071": (_R18, 22),
    # reason 19
    "CV2-15-009": (_R19, 22),
}


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
    text = DECISIONS.read_text() if text is None else text
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
    assert entries, f"the {NOT_APPLICABLE_ENTRY} entry of docs/decisions.md lists no ID"
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
