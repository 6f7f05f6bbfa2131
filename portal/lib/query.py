"""Query parameters of API requests."""

from __future__ import annotations

from rest_framework.exceptions import ValidationError
from rest_framework.request import Request


def whole_number(request: Request, name: str, minimum: int | None = None) -> int:
    """The query parameter `name` as an int; anything else is a 400 that names it."""
    raw = request.query_params[name]
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"Give a whole number, not {raw[:40]!r}."]}) from None
    if minimum is not None and value < minimum:
        raise ValidationError({name: [f"Give a number of at least {minimum}."]})
    return value
