"""Request parsers beyond DRF's defaults."""

from __future__ import annotations

from typing import Any

import yaml
from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

TOO_DEEP = "The document is nested too deeply."


class JSONParser(parsers.JSONParser):
    """DRF's, except that JSON nested deeper than Python's decoder recurses is a 400, not a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(f"JSON parse error - {TOO_DEEP}") from exc


class YAMLParser(BaseParser):
    """Accepts job specs as YAML, so the same file works with curl, the CLI and the web form."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = yaml.safe_load(stream.read().decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ParseError(f"YAML parse error: {exc}") from exc
        except RecursionError as exc:
            raise ParseError(f"YAML parse error: {TOO_DEEP}") from exc
        if not isinstance(data, dict):
            raise ParseError("A job spec must be a YAML mapping.")
        return data
