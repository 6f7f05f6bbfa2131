from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from scheduler.tasks import loop_paused, set_loop_paused


class Command(BaseCommand):
    help = "Pause or resume the scheduling loop and its housekeeping (running jobs go on), or show its state."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["pause", "resume", "status"])

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] != "status":
            set_loop_paused(options["action"] == "pause")
        self.stdout.write("paused" if loop_paused() else "running")
