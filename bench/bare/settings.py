"""The portal's settings plus the bare app and its URL (bench only)."""

from portal.settings import *  # noqa: F403
from portal.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "bench.bare"]
ROOT_URLCONF = "bench.bare.urls"
