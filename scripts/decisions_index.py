#!/usr/bin/env python3
"""Write docs/decisions-index.md from docs/decisions.md: every decision (D-n) with its title, its topic (the section
of decisions.md it sits in) and its status: current, amended by D-m, or superseded by D-m (a later decision that says
it "supersedes" or "replaces" D-n; "amends" for amended). A superseded decision must say so at its top
("Superseded by D-m."), and `--check` fails when one does not, or when the index on disk is not what this writes.

    python scripts/decisions_index.py          # rewrite docs/decisions-index.md
    python scripts/decisions_index.py --check  # exit 1 if it is stale or a superseded decision does not say so

Standard library only."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = ROOT / "docs" / "decisions.md"
INDEX = ROOT / "docs" / "decisions-index.md"
ENTRY = re.compile(r"^D-(\d+)\. \*\*(.+?)\*\*", re.S)
RELATION = re.compile(r"\b(supersedes|replaces|amends)\s+((?:D-\d+(?:,\s*|\s+and\s+)?)+)", re.I)


@dataclass
class Decision:
    number: int
    title: str
    topic: str
    text: str
    superseded_by: list[int] = field(default_factory=list)
    amended_by: list[int] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.superseded_by:
            return "superseded by " + ", ".join(f"D-{n}" for n in self.superseded_by)
        if self.amended_by:
            return "current; amended by " + ", ".join(f"D-{n}" for n in self.amended_by)
        return "current"


def parse(text: str) -> list[Decision]:
    decisions, topic, current = [], "General", None
    for block in re.split(r"\n(?=D-\d+\. \*\*|## )", text):
        if block.startswith("## "):
            topic = block[3:].splitlines()[0].strip()
            continue
        match = ENTRY.match(block)
        if not match:
            continue
        title = " ".join(match.group(2).split()).rstrip(".")
        current = Decision(int(match.group(1)), title, topic, block)
        decisions.append(current)
    by_number = {d.number: d for d in decisions}
    for decision in decisions:
        for verb, targets in RELATION.findall(decision.text):
            for number in map(int, re.findall(r"D-(\d+)", targets)):
                target = by_number.get(number)
                if target is None or target is decision:
                    continue
                (target.amended_by if verb.lower() == "amends" else target.superseded_by).append(decision.number)
    return decisions


def render(decisions: list[Decision]) -> str:
    lines = ["# Decisions: the index", "",
             "Every decision of [decisions.md](decisions.md), by topic, with its status. Written by",
             "`scripts/decisions_index.py` from decisions.md (the suite fails when it is stale). A decision is",
             "**current** unless a later one says it supersedes or replaces it; one that amends it leaves it",
             "current. The seed's own decisions 1–17 are in [spec/decisions.md](spec/decisions.md).", ""]
    topics: dict[str, list[Decision]] = {}
    for decision in decisions:
        topics.setdefault(decision.topic, []).append(decision)
    for topic, members in topics.items():
        lines += [f"## {topic}", "", "| decision | title | status |", "| --- | --- | --- |"]
        for d in members:
            title = d.title.replace("|", "\\|")
            lines.append(f"| D-{d.number} | {title} | {d.status} |")
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


def main(argv: list[str]) -> int:
    decisions = parse(DECISIONS.read_text())
    text = render(decisions)
    found = problems(decisions)
    if "--check" in argv:
        if not INDEX.exists() or INDEX.read_text() != text:
            found.append(f"{INDEX.relative_to(ROOT)} is stale: run python scripts/decisions_index.py")
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    INDEX.write_text(text)
    for problem in found:
        print(problem, file=sys.stderr)
    print(f"wrote {INDEX.relative_to(ROOT)}: {len(decisions)} decisions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
