"""Database work outside requests, writing several new rows in one statement for the few
paths where statements are the cost, and reading in a transaction that cannot write."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from channels.consumer import get_handler_name
from channels.db import DatabaseSyncToAsync
from django.db import close_old_connections, connection, models, reset_queries, transaction


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


@contextmanager
def read_only_transaction() -> Iterator[None]:
    """A transaction in which PostgreSQL refuses every write, always rolled back: for work that
    must change nothing (a dry run of a submission), so that a write slipping in through shared
    code is an error instead of a side effect. Started outside any other transaction it is also
    REPEATABLE READ, so that its several reads see one moment, as the scheduling cycle's do
    under its lock. Inside one (a test's) it is a savepoint, whose rollback ends the read-only
    mode with it."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        with connection.cursor() as cursor:
            if outermost:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            else:
                cursor.execute("SET TRANSACTION READ ONLY")
        try:
            yield
        finally:
            transaction.set_rollback(True)
