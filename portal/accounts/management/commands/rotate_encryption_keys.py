from __future__ import annotations

from typing import Any

from cryptography.fernet import Fernet
from django.core.management.base import BaseCommand, CommandError

from portal.lib.encryption import UndecryptableValue, encrypted_columns, rotate_column


class Command(BaseCommand):
    help = (
        "Re-encrypt every encrypted column (job secret variables, TOTP secrets) with the first key "
        "of FIELD_ENCRYPTION_KEYS; after it, keys further down the list may be removed. "
        "--new-key prints a fresh key and changes nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--new-key", action="store_true", help="print a new key and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["new_key"]:
            self.stdout.write(Fernet.generate_key().decode())
            return
        for model, field in encrypted_columns():
            try:
                count = rotate_column(model, field)
            except UndecryptableValue as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"{model._meta.label}.{field.name}: {count} re-encrypted")
