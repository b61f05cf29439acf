"""A subcommand of `manage.py bench`: its options and its run."""
from __future__ import annotations

import abc

from django.core.management.base import BaseCommand


class Subcommand(abc.ABC):
    name = ""
    help = ""

    @abc.abstractmethod
    def add_arguments(self, parser) -> None:
        """Declare the subcommand's options."""

    @abc.abstractmethod
    def handle(self, command: BaseCommand, options: dict) -> None:
        """Run the subcommand."""
