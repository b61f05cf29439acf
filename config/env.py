"""Environment access for settings. App code never reads settings at import time (STYLE R18)."""
from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if not value else int(value)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if not value:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def journal_url_for(database_url: str) -> str:
    """The journal database sits beside `default` on the same server: `<name>_journal`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(database_url)
    name = parts.path.lstrip("/") or "connector"
    return urlunsplit(parts._replace(path="/" + name + "_journal"))
