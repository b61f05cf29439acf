"""One V1 process generation's worker loop: claims and finishes accepted work until its generation is terminated
(then it exits at once and can never run again under that generation)."""
from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from v1 import runtime
from v1.errors import V1GenerationRefused


class Command(BaseCommand):
    help = "Run the V1 worker loop as one process generation."

    def add_arguments(self, parser):
        parser.add_argument("--generation", required=True)
        parser.add_argument("--idle", type=float, default=0.2, help="seconds to sleep when idle")
        parser.add_argument("--once", action="store_true", help="drain what is there and exit")

    def handle(self, *args, **options):
        generation = options["generation"]
        try:
            runtime.generation_running(generation)
        except V1GenerationRefused as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"v1 worker: generation {generation} running")
        while True:
            try:
                runtime.generation_running(generation)  # a terminated generation stops at once, even when idle
                sent = runtime.drain(generation, limit=50)
            except V1GenerationRefused as exc:
                self.stdout.write(f"v1 worker: {exc.detail}; exiting")
                return
            if options["once"]:
                self.stdout.write(f"v1 worker: drained ({sent} effects sent)")
                return
            if not sent:
                time.sleep(options["idle"])
