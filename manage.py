#!/usr/bin/env python
import os
import sys
from pathlib import Path

# The servers `make` found or started for this checkout (scripts/services.py ensure). A bare `manage.py` run
# without DATABASE_URL uses them rather than whatever database listens on the standard port.
SERVICES_ENV = Path(__file__).resolve().parent / ".data" / "services.env"


def load_services_env(path: Path) -> None:
    """Set each `export KEY=VALUE` of `path` that the environment does not set already."""
    for line in path.read_text().splitlines():
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep and not line.startswith("#") and key.strip().isidentifier():
            os.environ.setdefault(key.strip(), value.strip())


def main() -> None:
    services_env = Path(os.environ.get("CONNECTOR_SERVICES_ENV", SERVICES_ENV))
    if "DATABASE_URL" not in os.environ and services_env.is_file():
        load_services_env(services_env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.django.local")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
