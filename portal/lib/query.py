"""Query parameters of API requests."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.filters import OrderingFilter
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


class StrictOrderingFilter(OrderingFilter):
    """DRF's `ordering`, but a field the list does not offer is refused with a 400 that names the
    parameter and lists the choices: DRF drops it and answers in another order than the one asked
    for, as it would a bad `limit`. The choices are the view's, never anything of its rows.

    A single object's routes (a job, its actions) take no ordering: they ignore it, as any other
    parameter they do not take."""

    def filter_queryset(self, request: Request, queryset: Any, view: Any) -> Any:
        if getattr(view, "detail", False):
            return queryset
        return super().filter_queryset(request, queryset, view)

    def remove_invalid_fields(
        self, queryset: Any, fields: list[str], view: Any, request: Request
    ) -> list[str]:
        offered = [name for name, _ in self.get_valid_fields(queryset, view, {"request": request})]
        for term in fields:
            if term.removeprefix("-") not in offered:
                choices = ", ".join(f"{name}, -{name}" for name in offered)
                raise ValidationError(
                    {
                        self.ordering_param: [
                            f"Unknown field {term[:40]!r}: order by one or more of {choices},"
                            " separated by commas."
                        ]
                    }
                )
        return fields
