"""Many-row INSERT and UPDATE for the poll path, where Django's bulk_create/bulk_update cost
more than the database does (bulk_update builds a CASE expression per row and field: over
a second for the 32,768 GPU rows of 4,096 hosts). Values are adapted per column only where
the driver needs it (datetimes, JSON); everything else is passed as is.

* PostgreSQL: COPY, the fastest way in: rows are streamed to the server (psycopg formats
  them in C). An update copies into a temporary table, then runs one UPDATE ... FROM it.
  (A VALUES list per batch is slower twice over: the server plans a statement with
  thousands of parameters, and psycopg re-parses any statement over 4 KB on every call.)
* SQLite (and others): executemany of a one-row INSERT or UPDATE, which sqlite3 runs in C
  (microseconds a row, no SQL text to build).
Columns not named keep their values (INSERT: their database default, so only leave out
nullable columns or ones with a db_default).
"""
from __future__ import annotations

import json

from django.db import connection, models, transaction


def db_datetime(value):
    """A datetime as the driver wants it for a DateTimeField (adapt once, reuse per row)."""
    return connection.ops.adapt_datetimefield_value(value)


def _adapters(model, fields, prepared: bool):
    adapters = []
    for name in fields:
        field = model._meta.get_field(name)
        if isinstance(field, models.JSONField) and connection.vendor == "postgresql":
            # COPY takes JSON as text (prepared: already a string)
            adapters.append(None if prepared else (lambda value, field=field: json.dumps(value, cls=field.encoder)))
        elif not prepared and isinstance(field, (models.DateTimeField, models.JSONField)):
            adapters.append(lambda value, field=field: field.get_db_prep_value(value, connection, prepared=False))
        else:
            adapters.append(None)
    return adapters


def _adapt(rows, adapters):
    if not any(adapters):
        return rows
    return [tuple(value if adapt is None else adapt(value) for value, adapt in zip(row, adapters)) for row in rows]


def _copy(cursor, sql: str, rows) -> None:
    with cursor.copy(sql) as copy:
        for row in rows:
            copy.write_row(row)


def insert_rows(model, fields: list[str], rows: list[tuple], *, prepared: bool = False) -> None:
    """INSERT rows (tuples in `fields` order). `prepared`: datetimes already went through
    db_datetime and JSON through json.dumps - skips per-value adaptation."""
    if not rows:
        return
    meta, quote = model._meta, connection.ops.quote_name
    rows = _adapt(rows, _adapters(model, fields, prepared))
    table = quote(meta.db_table)
    columns = ", ".join(quote(meta.get_field(name).column) for name in fields)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            _copy(cursor, f"COPY {table} ({columns}) FROM STDIN", rows)
        else:
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})", rows)


def update_rows(model, fields: list[str], rows: list[tuple], *, prepared: bool = False) -> None:
    """UPDATE by primary key. rows: (pk, value of fields[0], value of fields[1], ...)."""
    if not rows:
        return
    meta, quote = model._meta, connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    columns = [quote(meta.get_field(name).column) for name in fields]
    rows = _adapt(rows, [None, *_adapters(model, fields, prepared)])
    with transaction.atomic(), connection.cursor() as cursor:  # the scratch table lives until commit
        if connection.vendor == "postgresql":
            types = [meta.pk.rel_db_type(connection)] + [_db_type(meta.get_field(name)) for name in fields]
            scratch = quote(f"fabricpool_bulk_{meta.db_table}")
            cursor.execute(f"CREATE TEMPORARY TABLE {scratch} ({', '.join(f'c{i} {t}' for i, t in enumerate(types))}) ON COMMIT DROP")
            _copy(cursor, f"COPY {scratch} FROM STDIN", rows)
            assignments = ", ".join(f"{column} = v.c{i + 1}" for i, column in enumerate(columns))
            cursor.execute(f"UPDATE {table} SET {assignments} FROM {scratch} AS v WHERE {table}.{pk} = v.c0")
            cursor.execute(f"DROP TABLE {scratch}")  # the name is free again within this transaction
        else:
            assignments = ", ".join(f"{column} = %s" for column in columns)
            cursor.executemany(f"UPDATE {table} SET {assignments} WHERE {pk} = %s", [(*row[1:], row[0]) for row in rows])


def _db_type(field) -> str:
    return field.db_type(connection) if field.is_relation else field.cast_db_type(connection)
