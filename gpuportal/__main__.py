"""``python -m gpuportal`` is the same as the ``gpuportal`` command."""

from __future__ import annotations

import sys

from gpuportal.cli import main

if __name__ == "__main__":
    sys.exit(main())
