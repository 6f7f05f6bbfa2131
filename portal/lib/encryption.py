"""Encryption at rest for the few values the portal must be able to read back: job secret
variables, admins' TOTP secrets, and users' webhook URLs and signing secrets.

Passwords and tokens are hashed; these cannot be, because the portal hands them on (to a job's
agents) or computes with them (a second factor). They are stored as Fernet tokens (AES-128-CBC
with an HMAC-SHA256, cryptography's recipe) under FIELD_ENCRYPTION_KEYS: the first key encrypts,
every key decrypts, so a new key goes first and the old ones stay until
`manage.py rotate_encryption_keys` has re-encrypted every row. A value no key opens is an error
that names the setting, never an empty value.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.apps import apps
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models.query_utils import DeferredAttribute


class UndecryptableValue(RuntimeError):
    """A stored value that none of FIELD_ENCRYPTION_KEYS opens: its key was removed too early,
    or the keys of another deployment are configured."""


@functools.lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def fernet() -> MultiFernet:
    return _fernet(tuple(settings.FIELD_ENCRYPTION_KEYS))


def encrypt_text(value: str) -> str:
    return fernet().encrypt(value.encode("utf-8")).decode("ascii")


def decrypt_text(token: str, what: str = "a stored value") -> str:
    try:
        return fernet().decrypt(token.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeEncodeError):
        raise UndecryptableValue(
            f"{what} cannot be decrypted with any of FIELD_ENCRYPTION_KEYS: the key that encrypted it "
            "is not configured (removed before `manage.py rotate_encryption_keys` ran, or another "
            "deployment's keys)."
        ) from None


class Ciphertext(str):
    """A value as stored (a Fernet token) that nobody has read yet."""


class DecryptOnRead(DeferredAttribute):
    """The attribute of an encrypted field: decrypted the first time it is read.

    Loading rows costs no decryption (a scheduling cycle loads every pending job and never reads
    their secrets), an object saved unread writes its token back unchanged, and a missing key is
    an error where a secret is used, not wherever a job is listed. A data descriptor (it has
    __set__), so reads come here even when the instance holds the value.
    """

    def __get__(self, instance: Any, cls: Any = None) -> Any:
        if instance is None:
            return self
        value = super().__get__(instance, cls)
        if isinstance(value, Ciphertext):
            value = self.field.decrypt(value)
            instance.__dict__[self.field.attname] = value
        return value

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.field.attname] = value


class EncryptedField(models.TextField):
    """The base of the encrypted fields: a text column holding a Fernet token, or the empty
    string for an empty value (which hides nothing). `values()` gives the stored tokens; the
    attribute of an object gives the value."""

    descriptor_class = DecryptOnRead

    def from_db_value(self, value: str | None, expression: Any, connection: Any) -> Any:
        if value is None:
            return None
        if value == "":
            return self.empty_value()
        return Ciphertext(value)

    def empty_value(self) -> Any:
        return ""

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        # What the object holds, without reading (and decrypting) it through the attribute.
        if self.attname in model_instance.__dict__:
            return model_instance.__dict__[self.attname]
        return super().pre_save(model_instance, add)

    def get_prep_value(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, Ciphertext):
            return str(value)  # unread since it was loaded: the token as it is
        plain = self.to_plaintext(value)
        return encrypt_text(plain) if plain else ""

    def decrypt(self, token: str) -> Any:
        return self.from_plaintext(decrypt_text(token, f"{self.model.__name__}.{self.name}"))

    def to_plaintext(self, value: Any) -> str:
        raise NotImplementedError

    def from_plaintext(self, plain: str) -> Any:
        raise NotImplementedError


class EncryptedTextField(EncryptedField):
    """A string stored encrypted."""

    def to_plaintext(self, value: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"{self.name} holds a string, not {type(value).__name__}")
        return value

    def from_plaintext(self, plain: str) -> str:
        return plain


class EncryptedJSONField(EncryptedField):
    """A JSON object stored encrypted; an empty object is stored as the empty string, since which
    names a job keeps secret is no secret (the spec lists them, masked)."""

    def empty_value(self) -> dict[str, Any]:
        return {}

    def to_plaintext(self, value: Any) -> str:
        if not isinstance(value, dict):
            raise TypeError(f"{self.name} holds a JSON object, not {type(value).__name__}")
        return json.dumps(value, separators=(",", ":"), sort_keys=True) if value else ""

    def from_plaintext(self, plain: str) -> dict[str, Any]:
        return json.loads(plain)

    def to_python(self, value: Any) -> Any:
        """Fixtures (dumpdata, loaddata) carry the object as JSON text, see value_to_string."""
        if isinstance(value, str):
            return json.loads(value) if value else {}
        return value

    def value_to_string(self, obj: models.Model) -> str:
        return json.dumps(self.value_from_object(obj))


ENCRYPTED_FIELDS = (EncryptedTextField, EncryptedJSONField)


def encrypted_columns() -> list[tuple[type[models.Model], models.Field]]:
    """Every model field stored encrypted, for the rotation command."""
    return [
        (model, field)
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, ENCRYPTED_FIELDS)
    ]


def rotate_column(model: type[models.Model], field: models.Field, batch_size: int = 500) -> int:
    """Re-encrypts every non-empty value of one column with the first key; returns how many.

    Works on the stored tokens (MultiFernet.rotate), so plaintext never passes through a model
    instance; a value no key opens raises UndecryptableValue naming the row, and the rows of
    earlier batches stay rotated (running the command again is safe).
    """
    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(field.column)
    pk = connection.ops.quote_name(model._meta.pk.column)
    rotator = fernet()
    done, last = 0, None
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            where = f"{column} <> ''" + (f" AND {pk} > %s" if last is not None else "")
            cursor.execute(
                f"SELECT {pk}, {column} FROM {table} WHERE {where} ORDER BY {pk} LIMIT %s FOR UPDATE",
                [last, batch_size] if last is not None else [batch_size],
            )
            rows = cursor.fetchall()
            for row_pk, token in rows:
                try:
                    rotated = rotator.rotate(token.encode("ascii")).decode("ascii")
                except InvalidToken:
                    raise UndecryptableValue(
                        f"{model.__name__}.{field.name} of row {row_pk} cannot be decrypted with any of "
                        "FIELD_ENCRYPTION_KEYS; put the key that encrypted it back in the list."
                    ) from None
                cursor.execute(f"UPDATE {table} SET {column} = %s WHERE {pk} = %s", [rotated, row_pk])
        if not rows:
            return done
        done += len(rows)
        last = rows[-1][0]
