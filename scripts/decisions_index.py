#!/usr/bin/env python3
"""The decision record: one page per topic under docs/decisions/, the short docs/decisions.md (how a decision is
written, and the list of topic pages), and docs/decisions-index.md (every decision with its topic and its status:
current, amended by D-m, or superseded by D-m, from a later decision that says it "supersedes" or "replaces" D-n;
"amends" for amended).

    python3 scripts/decisions_index.py          # file every decision of docs/decisions.md into its topic page,
                                                # rewrite the topic pages, the list in decisions.md and the index
                                                # (`--file` is accepted and does the same)
    python3 scripts/decisions_index.py --check  # exit 1 if anything is stale, a decision is still in decisions.md,
                                                # a number is used twice or a superseded decision does not say so

A new decision is written at the end of docs/decisions.md, under a "## " heading of its own; the script moves it,
verbatim (relative links rebased to docs/decisions/), to the page of its topic, in number order, and says where it
put it and why. The topic is, in this order: the D-number table NUMBERS below, the page it already sits on, and
the topic whose filed decisions its words are closest to (Topics). Running it twice changes nothing. A
topic page that would pass MAX_LINES continues on `<topic>-2.md`, `<topic>-3.md`, ...; `--root DIR` works on another
checkout (the tests use it). Standard library only."""
from __future__ import annotations

import math
import re
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"^D-(\d+)\. \*\*(.+?)\*\*", re.S)
RELATION = re.compile(r"\b(supersedes|replaces|amends)\s+((?:D-\d+(?:,\s*|\s+and\s+)?)+)", re.I)
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"(`[^`\n]*`)")
MAX_LINES = 600
# New decisions go below this line of docs/decisions.md; everything below it is filed.
MARKER = ("<!-- New decisions go below, each under a \"## \" heading; scripts/decisions_index.py files them by "
          "topic. -->")
LIST_START = "<!-- The topic list is written by scripts/decisions_index.py. -->"
LIST_END = "<!-- End of the topic list. -->"

# slug -> (title, what the page holds). The order is the order of the list and of the index.
TOPICS: dict[str, tuple[str, str]] = {
    "epochs": ("Serving epochs, owners and publication barriers",
               "owner protocols and receipts, preparing and verifying a ServingEpoch, its rejection codes, the "
               "owner publication barriers, and retiring a draining epoch"),
    "admission": ("Admission and materialization",
                  "what the REST admission accepts and refuses, the one-statement admission, the web server's "
                  "refusals, hostile input, and how a receipt's children are materialized"),
    "ordering": ("Ordering, lanes and replays",
                 "the ordering contracts, halted lanes and how they reopen, replays, order-independent routes"),
    "executions": ("Executions, claims and Runtime",
                   "claiming Executions (one and in batches), Runtime, result recording, poison items"),
    "outbound": ("Outbound effects",
                 "authoring outbound commands and their paths, what an answer proves, remote links and identities, "
                 "remote-call intents, uncertain effects and their repeats, the demo CRM"),
    "egress": ("Egress: permits, limits, retries and the halt drain",
               "the egress worker's claims and permits, batches, per-destination limits, receiver deferrals, "
               "retry schedules, holder generations, and confirming a halt when the last permit settles"),
    "delivery": ("REST bulk delivery", "the REST bulk delivery contract and its state machine"),
    "cutover-activation": ("Cutover: first and whole-service activation",
                           "the V1 -> V2 cutover's activation: whole-service transitions of the gates, the owner "
                           "reread, the first-activation coordinator and its recovery, ordering dispositions, the "
                           "activation inventory and provider I/O"),
    "cutover-v1": ("Cutover: V1, restore points, preflight and removal",
                   "the V1 release behind the cutover port: its shutdown, its provider calls in flight, restore "
                   "points, preflight and the readiness certificate, V1's retirement and removal, V1 predecessors"),
    "cutover-succession": ("Cutover: successor epochs and the drain",
                           "V2 -> V2 succession: the activation scope, handoffs, barriers, stale coordinators, "
                           "the succession drain"),
    "governance": ("Operator governance: approvals and screens",
                   "dual approval, the approval queue, the operator screens and their lists"),
    "security": ("Security and identity", "operator identities, database roles and privileges, state tokens, "
                                          "sign-in throttling"),
    "operations": ("Operations: processes, observability, durability",
                   "the processes and their queues, connections, the web server, traces, logs, metrics, liveness, "
                   "durable commits and the supervisor"),
    "performance": ("Performance: benches and measured costs",
                    "what each bench measures and how, budgets and goals, profiles and what was left alone"),
    "scale-out": ("Scale-out: accounts and Citus", "the scale-out placement, hot statements that name their account, "
                                                    "per-account and per-shard claims"),
    "structure": ("Code structure: apps, boundaries and layout",
                  "the apps and their allowed imports, the shared kernel, module size, the package layout"),
    "testing": ("Testing: requirement coverage and the suite",
                "requirement coverage, tests that can fail, the suite's speed, isolation and waiting"),
}


def _numbers(spec: str) -> list[int]:
    found = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        found += range(int(low), int(high or low) + 1)
    return found


# The decisions made before the record was split by topic, and any later one whose heading or words mislead.
NUMBERS: dict[int, str] = {n: topic for topic, spec in {
    "epochs": "101-105, 138, 267, 284, 300-301",
    "admission": "106, 108, 160-161, 164-167, 199, 201-203, 217, 251-252, 261-263, 269-270, 294, 297",
    "ordering": "107, 109, 192-194, 196, 310",
    "executions": "110-112, 115, 168-169, 172, 204-206, 254-256, 293, 295-296, 398, 480",
    "outbound": "113-114, 116-117, 170-171, 174, 190-191, 220, 305-309, 330, 430-436, 440-442",
    "egress": "118, 221-224, 335-336, 338, 345-350, 371-374, 380-382, 384, 397, 399-402, 405, 420-426",
    "delivery": "119-127",
    "cutover-activation": "139, 207, 210-211, 272, 278-279, 281, 283, 287, 289-290, 302, 311-312, 320-321",
    "cutover-v1": "136-137, 150-156, 185, 208, 291-292, 325-329, 331",
    "cutover-succession": "128-134, 268, 280, 282, 285-286, 288, 315-317",
    "governance": "135, 195, 197, 460-464, 470-473, 483-485, 490-493",
    "security": "180-184, 404",
    "operations": "162-163, 173, 198, 225-233, 235-236, 360, 410-412",
    "performance": "177, 209, 218-219, 253, 257, 271, 275-276, 340-344, 351-352, 358-359, 361, 365, 383, 388-392, 403",
    "scale-out": "240-246, 264-265, 396",
    "structure": "200, 215, 258-260, 266, 510-512, 520-529, 550-554",
    "testing": "175-176, 178-179, 212-214, 237, 250, 337, 450-453, 500-502",
}.items() for n in _numbers(spec)}

# Words that say nothing about a topic.
STOP = frozenset("the and for that with from its are not one this each which when only into but has have what same all "
                 "any per than then their them they who was were will can may does never every other own".split())


@dataclass
class Decision:
    number: int
    title: str
    topic: str
    text: str
    superseded_by: list[int] = field(default_factory=list)
    amended_by: list[int] = field(default_factory=list)
    page: str = ""
    how: str = ""

    @property
    def status(self) -> str:
        if self.superseded_by:
            return "superseded by " + ", ".join(f"D-{n}" for n in self.superseded_by)
        if self.amended_by:
            return "current; amended by " + ", ".join(f"D-{n}" for n in self.amended_by)
        return "current"


class Paths:
    def __init__(self, root: Path):
        self.root = root
        self.docs = root / "docs"
        self.decisions = self.docs / "decisions.md"
        self.pages = self.docs / "decisions"
        self.index = self.docs / "decisions-index.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """(heading, decision text) for every decision of a text, in order; the heading is the last "## " above it."""
    found, heading = [], ""
    for block in re.split(r"\n(?=D-\d+\. \*\*|## )", text):
        if block.startswith("## "):
            heading = block[3:].splitlines()[0].strip()
            continue
        if ENTRY.match(block):
            found.append((heading, block.rstrip()))
    return found


def rebase(text: str) -> str:
    """A decision's relative links, written from docs/, as seen from docs/decisions/. Inline code is left alone."""
    def fix(match: re.Match) -> str:
        target = match.group(1)
        if re.match(r"^(https?:|mailto:|#)", target):
            return match.group(0)
        return f"]({'../' + target})"

    parts = CODE.split(text)
    return "".join(part if i % 2 else LINK.sub(fix, part) for i, part in enumerate(parts))


def words(decision: Decision) -> Counter:
    """A decision's words, its title's counted three times."""
    def split(text: str) -> list[str]:
        return [w for w in re.findall(r"[a-z_][a-z0-9_\-]{2,}", text.lower()) if w not in STOP]
    return Counter(split(decision.title) * 3 + split(decision.text))


class Topics:
    """The topic whose filed decisions a new one reads most like: tf-idf vectors of the filed decisions, summed
    per topic, and the cosine of the new decision's vector with each sum. Over the 273 decisions filed when the
    record was split, leaving each out in turn, it names the topic the table gives for 188 (69%); the heading a
    decision was written under named it for 32%, a hand-written keyword list for 56%."""

    def __init__(self, filed: list[Decision]):
        counts = [(d.topic, words(d)) for d in filed]
        seen = Counter(w for _, c in counts for w in set(c))
        self.idf = {w: math.log(len(counts) / n) for w, n in seen.items()}
        self.sums: dict[str, Counter] = {}
        for topic, c in counts:
            self.sums.setdefault(topic, Counter()).update(self.vector(c))
        self.norms = {t: math.sqrt(sum(x * x for x in v.values())) or 1.0 for t, v in self.sums.items()}

    def vector(self, c: Counter) -> dict[str, float]:
        v = {w: (1 + math.log(n)) * self.idf.get(w, 0.0) for w, n in c.items()}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    def ranked(self, decision: Decision) -> list[str]:
        v = self.vector(words(decision))
        score = {t: sum(x * s.get(w, 0.0) for w, x in v.items()) / self.norms[t] for t, s in self.sums.items()}
        return sorted(score, key=lambda t: (-score[t], list(TOPICS).index(t)))


def page_topic(path: Path) -> str | None:
    stem = re.sub(r"-\d+$", "", path.stem)
    return stem if stem in TOPICS else None


def strays(text: str) -> list[str]:
    """Text below the marker that is neither a "## " heading nor a decision (`D-NNN. **Title.** ...`): refused, so
    that nothing written there is dropped when the page is rewritten."""
    found = []
    for block in re.split(r"\n(?=D-\d+\. \*\*|## )", text):
        body = block.split("\n", 1)[1] if block.startswith("## ") else block
        if block.startswith("## ") and re.match(r"## +D-\d+", block):
            found.append(f"{block.splitlines()[0].strip()!r}: a decision begins with its own line "
                         "`D-NNN. **Title.** text` under the ## heading, not in the heading")
        elif body.strip() and not ENTRY.match(body.strip() if block.startswith("## ") else block) \
                and MARKER not in body and not body.strip().startswith("<!--"):
            found.append(f"text below the marker of docs/decisions.md is not a decision (each begins "
                         f"`D-NNN. **Title.**`): {body.strip()[:80]!r}")
    return found


def read_record(paths: Paths) -> tuple[list[Decision], list[Decision], list[str]]:
    """(decisions on the topic pages, decisions still in decisions.md, problems)."""
    filed, pending, found = [], [], []
    for page in sorted(paths.pages.glob("*.md")) if paths.pages.is_dir() else []:
        topic = page_topic(page)
        if topic is None:
            found.append(f"{page.relative_to(paths.root)} is not a topic page of scripts/decisions_index.py")
            continue
        for _, text in blocks(page.read_text()):
            number, title = _head(text)
            filed.append(Decision(number, title, NUMBERS.get(number, topic), text, page=page.name))
    main, theirs = unconflict(paths.decisions.read_text() if paths.decisions.exists() else "")
    if LIST_START not in main or LIST_END not in main:
        found.append("docs/decisions.md lost its topic list (the lines between LIST_START and LIST_END of "
                     "scripts/decisions_index.py): take its head from the branch that split the record, and keep "
                     "the new decisions below it")
    topics = Topics(filed) if filed else None
    found += strays(main[head_end(main):])  # (the other side of a merge conflict is an old record: prose is fine)
    for _, text in [b for part in [main[head_end(main):], *theirs] for b in blocks(part)]:
        number, title = _head(text)
        decision = Decision(number, title, NUMBERS.get(number, ""), rebase(text), how="number")
        if not decision.topic:
            if topics is None:
                found.append(f"D-{number} is in no topic: no topic page to compare it with; add it to NUMBERS")
                continue
            ranked = topics.ranked(decision)
            decision.topic, decision.how = ranked[0], f"words (next: {ranked[1]})"
        pending.append(decision)
    return filed, pending, found


def unconflict(main: str) -> tuple[str, list[str]]:
    """decisions.md as merged: (our side of every conflict, with the rest; the other sides). A branch that appended
    decisions to the unsplit record conflicts with the whole short page; its side holds the whole old record and
    its new decisions, and every decision of it is read as pending (the unchanged ones are dropped in merge)."""
    ours, theirs, side = [], [], None
    for line in main.splitlines(keepends=True):
        if line.startswith("<<<<<<< "):
            side = "ours"
        elif line.startswith("||||||| ") and side:
            side = "base"
        elif line.startswith("=======") and side:
            side = "theirs"
            theirs.append("")
        elif line.startswith(">>>>>>> ") and side:
            side = None
        elif side in (None, "ours"):
            ours.append(line)
        elif side == "theirs":
            theirs[-1] += line
    return "".join(ours), ["\n" + part for part in theirs]


def base_texts(root: Path) -> dict[int, str]:
    """Each decision's text (rebased) as the unsplit record last had it, from git: the base a branch made before
    the split changed a decision from. Empty outside a git checkout."""
    import subprocess

    def git(*args: str) -> str:
        run = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return run.stdout if run.returncode == 0 else ""

    split = git("log", "--reverse", "--format=%H", "-S", LIST_START, "--", "docs/decisions.md").split()
    if not split:
        return {}
    before = git("show", f"{split[0]}^:docs/decisions.md")
    return {_head(text)[0]: rebase(text) for _, text in blocks(before)}


def head_end(main: str) -> int:
    """Where the hand-written part of decisions.md ends: at the marker, or at the first decision or "## " heading
    below the topic list, whichever comes first (a merge may have put new decisions above the marker)."""
    ends = [len(main)]
    if MARKER in main:
        ends.append(main.index(MARKER))
    decision = re.search(r"^D-\d+\. \*\*", main, re.M)
    if decision:
        ends.append(decision.start())
    after = main.index(LIST_END) + len(LIST_END) if LIST_END in main else 0
    heading = re.compile(r"^## ", re.M).search(main, after) if after else None
    if heading:
        ends.append(heading.start())
    return min(ends)


def _head(text: str) -> tuple[int, str]:
    match = ENTRY.match(text)
    return int(match.group(1)), " ".join(match.group(2).split()).rstrip(".")


def merge(filed: list[Decision], pending: list[Decision], base: dict[int, str]) -> tuple[list[Decision], list[str]]:
    """The whole record. A pending decision with a new number joins its topic. One whose number is filed already:
    the same text is dropped; when only one side changed it since the split (base: the unsplit record's text), that
    side's text stands, on the filed page; when both changed it, or the number is used for another decision, it is
    a problem and nothing is written (edit the topic page by hand, take it out of decisions.md)."""
    found, by_number = [], {d.number: d for d in filed}
    record = list(filed)
    for d in pending:
        other = by_number.get(d.number)
        if other is None:
            record.append(d)
            by_number[d.number] = d
        elif other.text == d.text or base.get(d.number) == d.text:
            d.how = ""
        elif base.get(d.number) == other.text and other.title == d.title:
            other.text, d.how = d.text, "number (its text changed in a branch, replacing the page's)"
            d.page = other.page
        else:
            found.append(f"D-{d.number} is in docs/decisions.md and on decisions/{other.page} with another text "
                         f"(both changed it, or the number is used twice): edit it on its topic page and take it "
                         f"out of decisions.md")
    return record, found


def relate(decisions: list[Decision]) -> None:
    by_number = {d.number: d for d in decisions}
    for d in decisions:
        d.superseded_by, d.amended_by = [], []
    for decision in sorted(decisions, key=lambda d: d.number):
        for verb, targets in RELATION.findall(decision.text):
            for number in map(int, re.findall(r"D-(\d+)", targets)):
                target = by_number.get(number)
                if target is None or target is decision:
                    continue
                (target.amended_by if verb.lower() == "amends" else target.superseded_by).append(decision.number)


def paginate(decisions: list[Decision]) -> dict[str, list[Decision]]:
    """file name -> its decisions: each topic in number order, continued on `<topic>-2.md` past MAX_LINES."""
    pages: dict[str, list[Decision]] = {}
    for topic in TOPICS:
        members = sorted((d for d in decisions if d.topic == topic), key=lambda d: d.number)
        if not members:
            continue
        part, lines = 1, len(header(topic, 1).splitlines())
        for d in members:
            size = len(d.text.splitlines()) + 1
            name = f"{topic}.md" if part == 1 else f"{topic}-{part}.md"
            if pages.get(name) and lines + size > MAX_LINES:
                part, lines = part + 1, len(header(topic, part + 1).splitlines())
                name = f"{topic}-{part}.md"
            pages.setdefault(name, []).append(d)
            lines += size
        for name, members_ in pages.items():
            for d in members_:
                d.page = name
    return pages


def header(topic: str, part: int) -> str:
    title, holds = TOPICS[topic]
    suffix = f" (part {part})" if part > 1 else ""
    intro = (f"The project's decisions on {holds}, in number order. How a decision is written and numbered, and "
             f"the other topics: [decisions.md](../decisions.md); every decision with its status: "
             f"[decisions-index.md](../decisions-index.md). Written by `scripts/decisions_index.py`; edit a "
             f"decision here, add a new one at the end of decisions.md.")
    return f"# Decisions: {title}{suffix}\n\n{textwrap.fill(intro, 116, break_long_words=False)}\n"


def render_page(topic: str, part: int, members: list[Decision]) -> str:
    return header(topic, part) + "\n" + "\n\n".join(d.text for d in members) + "\n"


def render_list(pages: dict[str, list[Decision]]) -> str:
    lines = [LIST_START, ""]
    for name, members in pages.items():
        topic = page_topic(Path(name))
        part = int(name[:-3].rsplit("-", 1)[1]) if name[:-3] != topic else 1
        title = TOPICS[topic][0] + (f" (part {part})" if part > 1 else "")
        lines.append(textwrap.fill(f"- [{title}](decisions/{name}) ({len(members)} decisions): {TOPICS[topic][1]}.",
                                   116, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines + ["", LIST_END])


def render_index(decisions: list[Decision], pages: dict[str, list[Decision]]) -> str:
    lines = ["# Decisions: the index", "",
             "Every decision of the [topic pages](decisions.md), by topic, with its status. Written by",
             "`scripts/decisions_index.py` from the pages (the suite fails when it is stale). A decision is",
             "**current** unless a later one says it supersedes or replaces it; one that amends it leaves it",
             "current. The seed's own decisions 1–17 are in [spec/decisions.md](spec/decisions.md).", ""]
    for topic, (title, _) in TOPICS.items():
        members = sorted((d for d in decisions if d.topic == topic), key=lambda d: d.number)
        if not members:
            continue
        lines += [f"## {title}", "", "| decision | title | status |", "| --- | --- | --- |"]
        for d in members:
            name = d.title.replace("|", "\\|")
            lines.append(f"| [D-{d.number}](decisions/{d.page}) | {name} | {d.status} |")
        lines.append("")
    return "\n".join(lines)


def problems(decisions: list[Decision]) -> list[str]:
    found = []
    numbers = [d.number for d in decisions]
    found += [f"D-{n} is used twice" for n in sorted({n for n in numbers if numbers.count(n) > 1})]
    for d in decisions:
        if d.superseded_by and "Superseded by" not in d.text.split("\n", 3)[0] + d.text[:400]:
            found.append(f"D-{d.number} is superseded by D-{d.superseded_by[0]} but does not say so at its top")
    return found


def written(paths: Paths, decisions: list[Decision]) -> dict[Path, str | None]:
    """Every file the script writes: path -> its text (None: remove it)."""
    pages = paginate(decisions)
    out: dict[Path, str | None] = {paths.pages / name: render_page(
        page_topic(Path(name)), 1 if name[:-3] == page_topic(Path(name)) else int(name[:-3].rsplit("-", 1)[1]),
        members) for name, members in pages.items()}
    for old in paths.pages.glob("*.md") if paths.pages.is_dir() else []:
        if page_topic(old) is not None:
            out.setdefault(old, None)
    main, _ = unconflict(paths.decisions.read_text())
    head = main[:head_end(main)]
    if LIST_START in head and LIST_END in head:
        before, rest = head.split(LIST_START, 1)
        head = before + render_list(pages) + rest.split(LIST_END, 1)[1]
    out[paths.decisions] = head.rstrip("\n") + "\n\n" + MARKER + "\n"
    out[paths.index] = render_index(decisions, pages)
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--root") + 1]).resolve() if "--root" in argv else ROOT
    paths = Paths(root)
    filed, pending, fatal = read_record(paths)
    decisions, conflicts = merge(filed, pending, base_texts(root) if pending else {})
    fatal += conflicts
    found = list(fatal)
    relate(decisions)
    found += problems(decisions)
    files = written(paths, decisions)
    if "--check" in argv:
        if pending:
            found.append(f"{len(pending)} decisions are still in docs/decisions.md "
                         f"(D-{pending[0].number}, ...): run python3 scripts/decisions_index.py")
        for path, text in files.items():
            if text is None or not path.exists() or path.read_text() != text:
                found.append(f"{path.relative_to(root)} is stale: run python3 scripts/decisions_index.py")
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    if fatal:  # nothing is written: a decision would be lost or misplaced
        for problem in found:
            print(problem, file=sys.stderr)
        return 1
    for path, text in files.items():
        if text is None:
            path.unlink()
        elif not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for problem in found:
        print(problem, file=sys.stderr)
    for d in pending:
        if d.how:
            print(f"filed D-{d.number} ({d.title[:60]}) into decisions/{d.page}, by its {d.how}")
    print(f"{len(decisions)} decisions on {sum(1 for t in files.values() if t) - 2} topic pages, "
          f"{sum(1 for d in pending if d.how)} filed from decisions.md; wrote {paths.index.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
