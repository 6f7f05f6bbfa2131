"""GPU Portal client: the ``gpuportal`` CLI, a REST client and the in-job checkpoint helper.

Nothing is imported here on purpose: ``gpuportal.checkpoint`` must work inside a job image
that has only the standard library, while ``gpuportal.client`` needs httpx and pydantic.
"""

from __future__ import annotations

__version__ = "0.1.0"
