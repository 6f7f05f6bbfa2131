"""The Celery app: the worker runs the scheduling loop and housekeeping, beat triggers them."""

from __future__ import annotations

import logging.config
import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging, task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.conf.include = ["scheduler.tasks"]


@setup_logging.connect
def use_django_logging(**kwargs: Any) -> None:
    """Worker and beat log through Django's LOGGING (JSON lines with the task id), like the web
    process: a receiver of this signal stops Celery from replacing the root logger's handlers
    with its own format."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


@task_postrun.connect
def forget_logged_statements(**kwargs: Any) -> None:
    """A task is a unit of work like a request (portal.lib.db.end_of_work)."""
    from portal.lib.db import end_of_work

    end_of_work()
