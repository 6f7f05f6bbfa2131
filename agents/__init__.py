"""The GPU Portal node agent: runs job attempts on one GPU host and reports to the portal.

Nothing in this package imports Django or the portal; the portal imports
``agents.protocol`` from here (tests/agents/test_no_django_import.py enforces it).
"""

from __future__ import annotations

AGENT_VERSION = "0.1.0"
