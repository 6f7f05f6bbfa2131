"""How a benchmark ends: one JSON object on the last line of stdout, which is what the commands
in docs/benchmarks.md read, and, without `--json`, the same figures one per line on stderr for
a person at a terminal."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any


def print_result(result: Mapping[str, Any], json_only: bool) -> None:
    if not json_only:
        width = max((len(key) for key in result), default=0)
        for key, value in result.items():
            print(f"{key:>{width}}: {value}", file=sys.stderr)
    print(json.dumps(result))
