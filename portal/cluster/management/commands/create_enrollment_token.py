from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from portal.cluster.services import create_enrollment_token


class Command(BaseCommand):
    help = (
        "Creates a one-time enrollment token for an agent (python -m agents --enroll-token-file) "
        "and prints it once. With a node name it enrolls only that node, new or existing; "
        "without, any new node."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--node", default="", help="The node name the token may enroll.")
        parser.add_argument(
            "--valid-minutes",
            type=int,
            default=settings.ENROLLMENT_TOKEN_TTL_MINUTES,
            help=f"Lifetime, at most {settings.ENROLLMENT_TOKEN_MAX_TTL_MINUTES} (default %(default)s).",
        )
        parser.add_argument(
            "--token-file", type=Path, help="Write the token to this file (mode 600) instead."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            token, raw = create_enrollment_token(None, options["node"], options["valid_minutes"])
        except (ValueError, ValidationError) as exc:
            raise CommandError(str(getattr(exc, "messages", [exc])[0])) from exc
        if options["token_file"]:
            options["token_file"].touch(mode=0o600)
            options["token_file"].chmod(0o600)
            options["token_file"].write_text(raw + "\n")
            self.stdout.write(f"{token}: {options['token_file']}")
        else:
            self.stdout.write(raw)
