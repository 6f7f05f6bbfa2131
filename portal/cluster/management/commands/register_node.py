from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from portal.cluster.models import Node
from portal.cluster.services import issue_node_token, write_secret_file


class Command(BaseCommand):
    help = "Registers a GPU host (or gives an existing one a new agent token) and prints the token once."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name", help="The node name the agent will use (--node-name).")
        parser.add_argument("--rack", default="")
        parser.add_argument(
            "--token-file", type=Path, help="Write the token to this file (mode 600) instead."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        if not name.replace("-", "").replace("_", "").isalnum():
            raise CommandError(f"{name!r} is not a valid node name: use letters, digits, '-' and '_'.")
        node, created = Node.objects.get_or_create(name=name, defaults={"rack": options["rack"]})
        token = issue_node_token(node, None)
        if options["token_file"]:
            write_secret_file(options["token_file"], token + "\n")
            self.stdout.write(
                f"{'Registered' if created else 'New token for'} node {name}: {options['token_file']}"
            )
        else:
            self.stdout.write(token)
