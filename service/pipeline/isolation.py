"""Which failures are one table's own, and whether its settings isolate the table for them.

A table's own failures (its schema, its absence from the catalog, access to it) concern that table
alone and retrying does not mend them: ``table.on_failure`` says whether they stop the sink
(``stop``) or isolate the table (``dead_letter``, ``pause``) while the other tables keep landing.
"""

from __future__ import annotations

from pyiceberg.exceptions import ForbiddenError, NoSuchTableError, UnauthorizedError

from service.config import TableConfig
from service.model.columns import SchemaError

TABLE_FAILURES = (SchemaError, NoSuchTableError, ForbiddenError, UnauthorizedError)


def isolates(settings: TableConfig, exc: BaseException) -> bool:
    """Whether ``exc`` is the table's own failure and its settings say to isolate the table for it."""
    return settings.on_failure != "stop" and isinstance(exc, TABLE_FAILURES)
