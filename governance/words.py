"""Words a person reads (issue 38 item 4, D-483): the label and one-line explanation of every state and mode code
the operator screens show, from one source, the "States and modes in words" section of docs/glossary.md (one
table `code | label | explanation` per state machine, the key after `###`). Read once per process, at startup
(GovernanceConfig.ready) so a malformed glossary fails the process, not a page. The states of a REST bulk delivery
operation are explained from the delivery contract's tuples instead (its five axes), the contract being their one
source. tests/governance/test_words.py fails when a value of a shown model's choices has no row."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from config.env import BASE_DIR
from effects.delivery.contract import contract

GLOSSARY = BASE_DIR / "docs" / "glossary.md"
SECTION = "## States and modes in words"
DELIVERY = "delivery"  # DeliveryOperation.state: explained from the contract
AXES = ("execution", "remote effect", "acknowledgement", "verification", "checkpoint")


@dataclass(frozen=True)
class Word:
    code: str
    label: str
    explanation: str


class GlossaryInvalid(Exception):
    """docs/glossary.md has no readable "States and modes in words" section."""


def parse(text: str) -> dict[str, dict[str, Word]]:
    """The section's tables by machine key. Raises GlossaryInvalid for a missing section, a row outside a table
    heading, a row without three cells or a code given twice in one table."""
    if SECTION not in text:
        raise GlossaryInvalid(f"no {SECTION!r} section")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    machines: dict[str, dict[str, Word]] = {}
    current: dict[str, Word] | None = None
    for number, line in enumerate(section.splitlines(), 1):
        if line.startswith("### "):
            current = machines.setdefault(line[4:].split(":", 1)[0].strip(), {})
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None or len(cells) != 3 or not cells[0].startswith("`") or not cells[0].endswith("`") \
                    or not cells[1] or not cells[2]:
                raise GlossaryInvalid(f"line {number} of the section is not a `code` | label | explanation row")
            code = cells[0][1:-1]
            if code in current:
                raise GlossaryInvalid(f"code {code!r} appears twice in one table")
            current[code] = Word(code, cells[1], cells[2])
    if not machines:
        raise GlossaryInvalid(f"the {SECTION!r} section has no table")
    return machines


def _delivery_words() -> dict[str, Word]:
    return {state: Word(state, state.replace("_", " ").capitalize(),
                        "; ".join(f"{axis}: {value.lower().replace('_', ' ')}" for axis, value in zip(AXES, axes)))
            for state, axes in contract().tuples.items()}


@functools.cache
def words() -> dict[str, dict[str, Word]]:
    """Every machine's words (read once per process)."""
    return {**parse(GLOSSARY.read_text(encoding="utf-8")), DELIVERY: _delivery_words()}


def word(machine: str, code) -> Word:
    """The words of `code` in `machine`; a code the glossary lacks reads as such (never a made-up label)."""
    code = "" if code is None else str(code)
    found = words().get(machine, {}).get(code)
    return found or Word(code, "(not in the glossary)", f"{machine} code {code!r} has no row in docs/glossary.md")
