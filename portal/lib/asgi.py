"""Django's ASGI handler, made to give every pooled database connection back when a client aborts.

When a browser goes away in the middle of a request (a reload, a closed tab), Django cancels the
request's task. The sync middleware and view keep running in the request's thread, and the
connection they borrowed from the pool lives in that thread's locals. Django hands it back in
request_finished (close_old_connections), but after a cancellation that signal ran elsewhere:

- Our middleware is sync, so Django calls its inner async handler through async_to_sync, which
  puts a CurrentThreadExecutor of the request's thread into the context. The cancelled
  sync_to_async copies that thread's context back into the request's task while the thread is
  still running, and the next thread-sensitive call of the task, request_finished, is sent to that
  executor: it fails ("CurrentThreadExecutor already quit or is broken"), or runs before the view
  has even borrowed its connection.
- Either way the connection stays in the thread's locals; when the request ends its thread ends,
  the connection is garbage-collected and its socket closed, and the pool never gets it back.
  After as many aborted requests as the pool holds, every request waits for the pool and fails.

PortalASGIHandler runs the response in a task of its own, so what a cancelled call leaves in a
context stays there, and closes the connections of the request's thread on that thread at the
very end of every request, whatever happened before.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.core.handlers.asgi import ASGIHandler
from django.db import connections


class PortalASGIHandler(ASGIHandler):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Each HTTP request's sync code runs on a thread of its own executor (as Django's own
        ThreadSensitiveContext would), so that its connections can be closed on that thread once
        the request is over: after anything still running there, even when it was cancelled."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await super().__call__(scope, receive, send)
        finally:
            await asyncio.wrap_future(executor.submit(connections.close_all))
            executor.shutdown(wait=False)

    async def run_get_response(self, request: Any) -> Any:
        """In a task of its own: a cancellation leaves the context of this task, not of the
        request's, pointing at the request thread's CurrentThreadExecutor, so request_finished
        still runs on the request's executor, after the view."""
        return await asyncio.create_task(super().run_get_response(request))
