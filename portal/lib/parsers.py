"""Request parsers beyond DRF's defaults."""

from __future__ import annotations

from typing import Any

import yaml
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser


class YAMLParser(BaseParser):
    """Accepts job specs as YAML, so the same file works with curl, the CLI and the web form."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = yaml.safe_load(stream.read().decode("utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ParseError(f"YAML parse error: {exc}") from exc
        if not isinstance(data, dict):
            raise ParseError("A job spec must be a YAML mapping.")
        return data
