"""Option values shared by the `manage.py bench` subcommands."""
from __future__ import annotations


def integer_list(value: str, option: str, *, low: int, high: int | None = None, needs: str) -> list[int]:
    """A comma-separated list of integers (`1,8`, `1_000,10_000`), sorted and without repeats. Raises
    CommandError naming `option` when a part is not an integer, or with `needs` when the list is empty or a value
    lies outside [low, high]."""
    from django.core.management.base import CommandError

    try:
        values = sorted({int(v.replace("_", "")) for v in value.split(",") if v.strip()})
    except ValueError as exc:
        raise CommandError(f"{option} must be comma-separated integers, not {value!r}") from exc
    if not values or values[0] < low or (high is not None and values[-1] > high):
        raise CommandError(needs)
    return values


def report_arguments(parser, *, database: str, budget: str) -> None:
    """The options of a bench that writes a JSON report and checks it: its throwaway database (`--database-name`,
    `--keep`), `--json` (write the report), `--from-json` (no run: read a saved report, to check it again) and
    `--check` (against the `budget` section of bench/budgets.json; see `save_and_check`)."""
    parser.add_argument("--database-name", default=database)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", default="", help="write the report to this file")
    parser.add_argument("--from-json", default="", help="no run: read this report (to check it again)")
    parser.add_argument("--check", action="store_true", help=f"fail unless bench/budgets.json '{budget}' holds")


def report_of(options: dict, run) -> dict:
    """The report `--from-json` names, or `run()` with the product's loggers quieted to WARNING (the bench's
    progress lines stay readable)."""
    import json
    import logging
    from pathlib import Path

    if options["from_json"]:
        return json.loads(Path(options["from_json"]).read_text(encoding="utf-8"))
    for logger in ("connector", "effects", "httpx"):
        logging.getLogger(logger).setLevel(logging.WARNING)
    return run()


def save_and_check(command, options: dict, report: dict, *, budget: str, check, goal: str) -> None:
    """Write a fresh report to `--json`; with `--check`, `check(report, budgets[budget])` lists what fails: a
    CommandError naming `goal` and each failure, else a success line naming `goal`."""
    import json
    from pathlib import Path

    from django.core.management.base import CommandError

    from bench import load_budgets

    if options["json"] and not options["from_json"]:
        Path(options["json"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if options["check"]:
        failures = check(report, load_budgets().get(budget) or {})
        if failures:
            raise CommandError(f"{goal} not met:\n  " + "\n  ".join(failures))
        command.stdout.write(command.style.SUCCESS(f"check passed: {goal}"))
