"""What the API answers when the object a URL names is not found.

Every view that looks one object up by its URL derives from NamedNotFound: a miss is a 404 that
names the object in the API's words ("No job 41."), where Django's names the model's class ("No
Job matches the given query."). The words come from the URL alone, so another tenant's object,
which the view's queryset leaves out, answers exactly as one that does not exist.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework.exceptions import NotFound
from rest_framework.generics import GenericAPIView


def not_found_message(noun: str, field: str, value: str) -> str:
    """'No job 41.', "No job 'abc'." or "No virtual cluster named 'x'.": the object asked for,
    named as the URL named it."""
    value = value[:64]
    if field == "name":
        return f"No {noun} named {value!r}."
    return f"No {noun} {value}." if value.isdecimal() else f"No {noun} {value!r}."


# (No docstring: the schema would give it as the description of every view without one.)
class NamedNotFound(GenericAPIView):
    noun: str | None = None  # what the answer calls the object; the model's verbose name by default

    def get_object(self) -> Any:
        try:
            return super().get_object()
        except Http404:
            kwarg = self.lookup_url_kwarg or self.lookup_field
            noun = self.noun or str(self.get_queryset().model._meta.verbose_name)
            raise NotFound(not_found_message(noun, self.lookup_field, str(self.kwargs[kwarg]))) from None
