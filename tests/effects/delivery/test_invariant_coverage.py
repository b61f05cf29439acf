"""Each of the contract's `invariants` is a test named after it (test_<invariant>) in tests/effects/delivery."""
from __future__ import annotations

import ast
from pathlib import Path

from effects.delivery.contract import contract

HERE = Path(__file__).parent


def _test_names() -> set[str]:
    names = set()
    for path in HERE.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name[len("test_"):])
    return names


def test_every_contract_invariant_has_a_test_named_after_it():
    missing = [name for name in contract().invariants if name not in _test_names()]
    assert missing == [], f"invariants without a test named after them: {missing}"


def test_every_failure_scenario_has_a_test_named_after_it():
    missing = [name for name in contract().failure_scenarios if name not in _test_names()]
    assert missing == [], f"failure scenarios without a test: {missing}"
