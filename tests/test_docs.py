"""The documentation is checked like code (issue 41 item 6): every link of README.md and docs/ resolves inside the
repository (a heading anchor included), every backticked path to a file of the repository exists, the pages stay
short enough to read (docs/benchmarks.md ≤ 400 lines, every other page ≤ 600, generated ones included, the vendored
specification excepted), and the vendored specification equals the shared one when that sits beside the checkout.
Pure file reads: no database."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# Records of history, where a file's former name is a fact, and the specification as received (it names the paths
# of its own map): their links are checked, their path mentions are not.
HISTORY = {*DOCS.glob("decisions/*.md"), *DOCS.glob("benchmarks/journal/*.md"), *DOCS.glob("spec/*.md")}
# Long by nature: the specification as the project received it (it must equal the shared one, so it is not split).
LONG = {*DOCS.glob("spec/*.md")}
SHARED = ROOT.parent / "shared"
VENDORED = {"connector-v2-execution-architecture.md": "seeds/connector-v2-execution-architecture.md",
            "connector-v2-requirements.md": "spec/connector-v2-requirements.md",
            "decisions.md": "spec/decisions.md", "ARCHITECTURE.md": "ARCHITECTURE.md", "STYLE.md": "STYLE.md"}
TOP = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"`([A-Za-z_][\w./-]*\.(?:py|md|sql|yaml|json|sh|html|txt|svg|toml|png))(?::\d+(?:-\d+)?)?`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def prose(page: Path) -> str:
    """The page without its fenced code blocks (a link inside a code sample is not a link)."""
    return re.sub(r"^ *```.*?^ *```", "", page.read_text(), flags=re.S | re.M)


def broken_references(pages: list[Path]) -> list[tuple[str, str, str]]:
    broken = []
    for page in pages:
        text = prose(page)
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text)):
            if re.match(r"^(https?:|mailto:)", target):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append((str(page.relative_to(ROOT)), "link", target))
            elif anchor and resolved.suffix == ".md" and anchor not in {
                    slug(line.lstrip("#")) for line in resolved.read_text().splitlines() if line.startswith("#")}:
                broken.append((str(page.relative_to(ROOT)), "anchor", target))
        if page in HISTORY:
            continue
        for path in PATH.findall(text):
            if path.split("/")[0] in TOP and not (ROOT / path).exists():
                broken.append((str(page.relative_to(ROOT)), "file", path))
    return broken


def test_every_link_and_file_reference_of_the_docs_resolves():
    """Proves: issue 41 item 6 (links and code references)."""
    assert broken_references(PAGES) == []


def test_the_checker_fails_on_a_broken_link_anchor_or_path(tmp_path):
    """A page linking a missing file, a missing heading, or naming a missing module is reported; the same page
    pointing at what exists is not. Proves: issue 41 item 6 (the checker can fail)."""
    page = DOCS / "_probe_checker.md"
    try:
        page.write_text("# Probe\n\n[ok](api.md) [gone](no-such-page.md) [anchor](api.md#no-such-heading) "
                        "[here](#probe) `connector/no_such_module.py` `connector/dbroles.py`\n")
        assert sorted(kind for _, kind, _ in broken_references([page])) == ["anchor", "file", "link"]
    finally:
        page.unlink()


def test_pages_are_short_enough_to_read():
    """Proves: issue 41 (docs/benchmarks.md ≤ 400 lines, every other page ≤ 600)."""
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PAGES if p not in LONG}
    assert lengths["docs/benchmarks.md"] <= 400
    assert {page: n for page, n in lengths.items() if n > 600} == {}


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared specification is not beside this checkout")
def test_the_vendored_specification_equals_the_shared_one():
    """docs/spec/ is the specification a clone reads; it must not drift from the shared one. Proves: issue 41
    item 2 (the repository stands on its own)."""
    for name, shared in VENDORED.items():
        assert (DOCS / "spec" / name).read_text() == (SHARED / shared).read_text(), name


def decisions_script(*args: str) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(ROOT / "scripts" / "decisions_index.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_decision_index_is_current_and_every_number_is_used_once():
    """The decisions sit on their topic pages (docs/decisions/), none is left in decisions.md, and
    docs/decisions-index.md and the topic list of decisions.md are what scripts/decisions_index.py writes from them:
    every decision with its topic and status; no number is used twice; a superseded decision says so at its top.
    Proves: issue 41 item 4."""
    check = decisions_script("--check")
    assert check.returncode == 0, check.stderr


def test_a_new_decision_in_decisions_md_is_filed_into_its_topic_page_once(tmp_path):
    """Decisions appended to decisions.md under headings of their own (as a branch does, and as a merge of such a
    branch leaves it, conflict markers and the old record included) are moved verbatim to their topic pages by the
    one command, their relative links rebased, the topic found from their words; an unchanged old decision is not
    filed twice; a second run changes nothing; `--check` fails before the run and passes after. Proves: issue 41
    item 4 (the record stays by topic as decisions are added)."""
    import shutil

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copytree(DOCS / "decisions", docs / "decisions")
    for name in ("decisions.md", "decisions-index.md"):
        shutil.copy(DOCS / name, docs / name)

    def text_of(page: str, number: int) -> str:
        body = (DOCS / "decisions" / page).read_text()
        start = body.index(f"\nD-{number}. ") + 1
        end = body.find("\nD-", start)
        return body[start:end if end > 0 else None].rstrip().replace(f"D-{number}. ", "D-{n}. ", 1)

    waits = text_of("testing.md", 450).replace("{n}", "998")
    drain = text_of("cutover-succession.md", 316).replace("{n}", "999") + " See [errors.md](errors.md), `[x](y)`."
    unchanged = text_of("epochs.md", 101).replace("{n}", "101")
    title, rest = (docs / "decisions.md").read_text().split("\n\n", 1)
    # As git leaves a merge of a branch that appended to the unsplit record: this page on our side of one conflict,
    # the whole old record with its new decisions on the other.
    (docs / "decisions.md").write_text(
        f"{title}\n\n<<<<<<< HEAD\n{rest}=======\nThe project's decisions.\n\n{unchanged}\n\n## Issue 99\n\n"
        f"{waits}\n\n## Something new (issue 99)\n\n{drain}\n>>>>>>> other\n")
    assert decisions_script("--check", "--root", str(tmp_path)).returncode == 1

    first = decisions_script("--root", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "filed D-998" in first.stdout and "filed D-999" in first.stdout and "filed D-101" not in first.stdout
    assert (docs / "decisions" / "epochs.md").read_text() == (DOCS / "decisions" / "epochs.md").read_text()
    assert waits in (docs / "decisions" / "testing.md").read_text()
    assert drain.replace("(errors.md)", "(../errors.md)") in (docs / "decisions" / "cutover-succession.md").read_text()
    record = (docs / "decisions.md").read_text()
    assert "D-998" not in record and "D-999" not in record and "Issue 99" not in record and "<<<<<<<" not in record
    assert "| [D-999](decisions/cutover-succession.md) |" in (docs / "decisions-index.md").read_text()

    snapshot = {p: p.read_text() for p in docs.rglob("*.md")}
    second = decisions_script("--root", str(tmp_path))
    assert second.returncode == 0, second.stderr
    assert {p: p.read_text() for p in docs.rglob("*.md")} == snapshot
    assert decisions_script("--check", "--root", str(tmp_path)).returncode == 0


def test_a_decision_filed_twice_with_another_text_is_refused(tmp_path):
    """A number already on a topic page, appended again to decisions.md with another text (a reused number, or an
    edit made to the old page in a branch), is refused and nothing is written. Proves: issue 41 item 4."""
    import shutil

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copytree(DOCS / "decisions", docs / "decisions")
    for name in ("decisions.md", "decisions-index.md"):
        shutil.copy(DOCS / name, docs / name)
    (docs / "decisions.md").write_text((docs / "decisions.md").read_text() +
                                       "## Again\n\nD-101. **Owner protocols, rewritten.** Text.\n")
    snapshot = {p: p.read_text() for p in docs.rglob("*.md")}
    run = decisions_script("--root", str(tmp_path))
    assert run.returncode == 1 and "D-101" in run.stderr
    assert {p: p.read_text() for p in docs.rglob("*.md")} == snapshot


def test_every_make_command_of_the_readme_and_the_integrating_page_is_a_target():
    """A fenced `sh` line `make X` names a target of the Makefile (the other blocks are run by
    tests/hostile/test_readme_try_it.py and tests/hostile/test_integrating_doc.py). Proves: issue 41 item 6."""
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for page in (ROOT / "README.md", DOCS / "integrating.md"):
        for block in re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.S | re.M):
            for line in block.splitlines():
                if line.startswith("make "):
                    assert line.split()[1] in targets, (page.name, line)


PROJECT_PACKAGES = ("connector", "effects", "cutover", "governance", "observability", "v1", "config", "demo",
                    "scripts")
SYMBOL = re.compile(r"`((?:%s)(?:\.[A-Za-z_]\w*)+)(?:\(\))?`" % "|".join(PROJECT_PACKAGES))


def symbol_exists(dotted: str) -> bool:
    """A dotted name of the docs names something real: a module (found, not necessarily importable as is, like
    config.django.production without its environment), an attribute of one, an `app.Model` label, an
    `app.codename` permission, or a named crash point (connector/faults.py)."""
    import importlib
    import importlib.util

    from django.apps import apps

    from connector.faults import POINTS

    if dotted in POINTS:
        return True
    app, _, rest = dotted.partition(".")
    if "." not in rest:
        try:
            config = apps.get_app_config(app)
        except LookupError:
            config = None
        if config is not None:
            models = list(config.get_models())
            if rest in {m.__name__ for m in models} or rest in {
                    f"{action}_{m._meta.model_name}" for m in models for action in m._meta.default_permissions} | {
                    codename for m in models for codename, _ in m._meta.permissions}:
                return True
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except (ImportError, ValueError):
            continue
        if i == len(parts):
            return True
        try:
            obj = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - a module that needs its environment still exists
            return False
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_code_symbol_the_docs_name_exists():
    """A backticked dotted name of the product (`connector.services.signatures.sign`, `effects.RemoteEffect`,
    `effects.reconcile_effect`, a crash point) in README.md or docs/ exists in the code; a renamed function makes
    this fail. The records of history and the specification as received are exempt. Proves: issue 41 item 6
    (code references)."""
    missing = []
    for page in PAGES:
        if page in HISTORY or page.name == "decisions-index.md":
            continue
        missing += [(str(page.relative_to(ROOT)), name) for name in SYMBOL.findall(prose(page))
                    if not symbol_exists(name)]
    assert missing == []
    assert not symbol_exists("connector.services.signatures.no_such_function")


@pytest.mark.parametrize("appended", [
    "## D-997. A title in the heading\n\nThe decision's text.\n",
    "## A heading\n\nProse that is not a decision.\n",
])
def test_text_below_the_marker_that_is_not_a_decision_is_refused_not_dropped(tmp_path, appended):
    """A decision written with its number in the "## " heading, or prose below the marker, would be lost when the
    page is rewritten: the command refuses, names it, and writes nothing. Proves: issue 41 item 4."""
    import shutil

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copytree(DOCS / "decisions", docs / "decisions")
    for name in ("decisions.md", "decisions-index.md"):
        shutil.copy(DOCS / name, docs / name)
    (docs / "decisions.md").write_text((docs / "decisions.md").read_text() + "\n" + appended)
    snapshot = {p: p.read_text() for p in docs.rglob("*.md")}
    run = decisions_script("--root", str(tmp_path))
    assert run.returncode == 1, run.stderr
    named = "D-997" if "D-997" in appended else "Prose that is not a decision"
    assert named in run.stderr and ("not a decision" in run.stderr or "not in the heading" in run.stderr)
    assert {p: p.read_text() for p in docs.rglob("*.md")} == snapshot
