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
