from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from portal.demo import seed_demo


class Command(BaseCommand):
    help = "Loads the demo cluster: users, tenants, VCs with quotas, flavors, priority classes, nodes."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--agent-token-dir", type=Path, help="Write one agent token file per demo node here."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seed_demo(options["agent_token_dir"])
        self.stdout.write("Demo cluster loaded.")
