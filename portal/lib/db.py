"""Database work outside requests, and writing several new rows in one statement for the few
paths where statements are the cost."""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name
from channels.db import DatabaseSyncToAsync
from django.db import close_old_connections, connection, models, reset_queries


def end_of_work() -> None:
    """What Django does around each request, for work that is not one (a websocket message, a
    telemetry write, a Celery task): connections past their age or broken are closed, and
    with DEBUG the statements logged so far are dropped. Django keeps up to 9,000 per
    connection, with their parameters (a whole chunk of a job's output each), and forgets them
    only when a request starts: a socket's thread would hold hundreds of megabytes."""
    reset_queries()
    close_old_connections()


class _DatabaseCall(DatabaseSyncToAsync):
    def thread_handler(self, loop: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().thread_handler(loop, *args, **kwargs)
        finally:
            reset_queries()


# Channels' database_sync_to_async (stale connections closed around each call), which also
# drops the statements DEBUG logged (end_of_work). Consumers reach the database through this.
database_sync_to_async = _DatabaseCall


class DirectDispatch:
    """For a consumer: Channels' dispatch less its thread hop to close stale database
    connections before every message. A consumer that reaches the database only through
    database_sync_to_async, which does that itself, and gets many messages a second (agents'
    reports, a shell's output) need not pay for it."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


def insert_together(*objs: models.Model) -> None:
    """Inserts unsaved instances, of any tables, in one statement, and sets their primary keys.

    Model.save() builds each INSERT through the ORM's compiler: about half a millisecond of CPU
    per row, and a round trip each. This writes the same columns with the same values (each
    field's pre_save and get_db_prep_save, as save() does, so defaults, auto_now_add and
    encrypted fields behave alike) as a chain of data-modifying CTEs, which PostgreSQL runs as
    one atomic statement. It sends no pre_save or post_save signals: only for models without
    receivers. A row may refer to another of the same call only when that one's id is already
    set (reserved from its sequence), and is then written with that id.
    """
    quote = connection.ops.quote_name
    ctes, selects, params = [], [], []
    for i, obj in enumerate(objs):
        meta = obj._meta
        fields = [f for f in meta.concrete_fields if f is not meta.auto_field or obj.pk is not None]
        columns = ", ".join(quote(f.column) for f in fields)
        values = ", ".join(["%s"] * len(fields))
        ctes.append(
            f"row{i} AS (INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({values}) "
            f"RETURNING {quote(meta.pk.column)})"
        )
        selects.append(f"(SELECT * FROM row{i})")
        params += [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT {', '.join(selects)}", params)
        for obj, pk in zip(objs, cursor.fetchone(), strict=True):
            obj.pk = pk
            obj._state.adding = False
            obj._state.db = connection.alias
