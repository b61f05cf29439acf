"""Benchmark support that is not a management command: the hot-account capacity bench
(`bench.hot_account`, run as `manage.py bench hot-account`) and the budget file both benches
check against (`bench/budgets.json`, one top-level section per bench: "hot_account", "history", ...).

Nothing here is imported by the product's request or worker paths."""
from __future__ import annotations

import json
from pathlib import Path

BUDGETS_PATH = Path(__file__).resolve().parents[1] / "bench" / "budgets.json"


def load_budgets(path: str | Path | None = None) -> dict:
    """The budget file as a dict (sections keyed by bench). A missing file is an empty dict."""
    target = Path(path) if path else BUDGETS_PATH
    if not target.exists():
        return {}
    data = json.loads(target.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{target} must hold a JSON object with one section per bench")
    return data


def history_ratio_limit(*, default: float, path: str | Path | None = None) -> float:
    """The `bench history --check` limit: the largest allowed p50 admission latency ratio between the largest and
    the smallest retained-history size (`history.max_p50_admission_ratio`), or `default` if the file has none."""
    section = load_budgets(path).get("history") or {}
    value = section.get("max_p50_admission_ratio")
    return float(value) if value is not None else default


def accounts_ratio_limit(*, default: float, path: str | Path | None = None) -> float:
    """The `bench accounts --check` limit: the largest allowed p50 ratio of one event's whole inbound chain between
    the largest and the smallest service size (`accounts.max_p50_ratio`), or `default` if the file has none."""
    section = load_budgets(path).get("accounts") or {}
    value = section.get("max_p50_ratio")
    return float(value) if value is not None else default
