from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmarks (`manage.py bench ...`): a top-level package above connector, effects and cutover, so that
    connector imports neither of them (import-linter contract; issue 18)."""

    name = "bench"
    verbose_name = "Benchmarks"
