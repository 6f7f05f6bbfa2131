"""CSV for list endpoints that people open in a spreadsheet."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer


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
        writer.writerows(rows)
        return out.getvalue().encode("utf-8")
