"""The protocol's JSON Schema, for docs, other languages and the drift test.

``python -m agents.protocol.schema`` prints it; ``--write`` refreshes the committed copy
next to this module. tests/agents/test_agent_protocol.py fails when the models and the
committed copy disagree, so every protocol change shows up as a reviewable diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from agents.protocol.messages import PROTOCOL_VERSION, AgentToPortal, PortalToAgent

SCHEMA_PATH = Path(__file__).with_name("schema.json")


def protocol_schema() -> dict[str, Any]:
    return {
        "protocol_version": PROTOCOL_VERSION,
        "agent_to_portal": TypeAdapter(AgentToPortal).json_schema(),
        "portal_to_agent": TypeAdapter(PortalToAgent).json_schema(),
    }


def render() -> str:
    return json.dumps(protocol_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    if argv[1:] == ["--write"]:
        SCHEMA_PATH.write_text(render())
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
