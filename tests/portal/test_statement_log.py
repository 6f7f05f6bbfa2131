"""With DEBUG, Django logs every statement with its parameters and forgets them only when a
request starts. Work that is not a request (websocket messages, the telemetry writer, Celery
tasks) drops them itself, or a long-lived thread keeps up to 9,000 per connection: a socket
streaming a job's output held hundreds of megabytes in `make up`."""

from __future__ import annotations

from typing import Any

import pytest
from celery.signals import task_postrun
from channels.db import database_sync_to_async as channels_database_sync_to_async
from django.db import connection
from django.test import override_settings

from portal.agentgw.ingest import buffer
from portal.cluster.models import Node
from portal.lib.db import database_sync_to_async


def run_a_statement() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text", ["x" * 10_000])


def statements_logged() -> int:
    return len(connection.queries_log)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@override_settings(DEBUG=True)
async def test_a_call_from_a_consumer_leaves_no_statement_logged() -> None:
    # Channels' own wrapper keeps them (what the consumers used before) ...
    await channels_database_sync_to_async(run_a_statement)()
    assert await channels_database_sync_to_async(statements_logged)() >= 1
    # ... the portal's drops them after each call.
    await database_sync_to_async(run_a_statement)()
    assert await database_sync_to_async(statements_logged)() == 0


@pytest.mark.django_db(transaction=True)
@override_settings(DEBUG=True)
def test_the_telemetry_writer_leaves_no_statement_logged(users: Any) -> None:
    from portal.agentgw.ingest import _write

    nodes = set(Node.objects.values_list("pk", flat=True))
    buffer._writer.submit(_write, [], nodes).result()  # heartbeats: UPDATE statements
    try:
        assert buffer._writer.submit(statements_logged).result() == 0
    finally:
        buffer.close_connections()


@pytest.mark.django_db
@override_settings(DEBUG=True)
def test_a_celery_task_leaves_no_statement_logged() -> None:
    run_a_statement()
    assert statements_logged() >= 1
    task_postrun.send(sender=None, task_id="t", task=None, args=(), kwargs={}, retval=None, state="SUCCESS")
    assert statements_logged() == 0
