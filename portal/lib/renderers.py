"""CSV for list endpoints that people open in a spreadsheet."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer

# What a spreadsheet takes as the start of a formula (or, for tab and CR, lets one follow).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A cell a spreadsheet shows as text rather than evaluates. User names and other text come
    from users (Django allows '-', '+' and '@' in user names): a cell such as `-1+1` or
    `=HYPERLINK(...)` would run as a formula in whoever opens the file (CSV injection), so such
    text gets a leading single quote, as OWASP advises. Numbers are left alone: a negative
    number is data, not a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class CSVRenderer(BaseRenderer):
    """Rows (a list, or the "results" of a dict) as CSV. Given "columns", an empty report still
    has its header line, so it is a CSV file (with a Content-Type) rather than an empty body."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        rows = data if isinstance(data, list) else data.get("results", [])
        columns = None if isinstance(data, list) else data.get("columns")
        if not rows and not columns:
            return b""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=columns or list(rows[0]))
        writer.writeheader()
        writer.writerows({key: spreadsheet_safe(value) for key, value in row.items()} for row in rows)
        return out.getvalue().encode("utf-8")
