"""Schema evolution: what a change in the events' schema means for the table, and applying it.

Changes Iceberg expresses as metadata only (no file is rewritten) are applied before the batch that
needs them is written: a new column (added as optional, so older files read it as null), a widened
type (int→long, float→double, decimal precision up at the same scale) and a required column becoming
optional; a list column's element (``tags.element``) evolves the same way. Anything else — a narrowing, a type change across families, a key column becoming optional —
is incompatible: the sink stops naming the column, or, under ``on_incompatible: dead_letter``, the
records carrying that schema go to the dead-letter topic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum

from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
)

from service.model.columns import Column, SchemaError

logger = logging.getLogger(__name__)


class EvolutionPolicy(StrEnum):
    STRICT = "strict"  # any difference between events and table stops the sink
    ADD_COLUMNS = "add_columns"  # new columns, widenings and relaxed nullability evolve the table


class IncompatibleSchema(SchemaError):
    """The events' schema can't be expressed as an evolution of the table's."""


@dataclass
class Evolution:
    add: list[Column] = field(default_factory=list)
    widen: list[tuple[str, IcebergType, IcebergType]] = field(default_factory=list)
    make_optional: list[str] = field(default_factory=list)
    incompatible: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.add or self.widen or self.make_optional)

    def describe(self) -> str:
        parts = [f"add {c.name} {c.type}" for c in self.add]
        parts += [f"widen {n} {a} → {b}" for n, a, b in self.widen]
        parts += [f"make {n} optional" for n in self.make_optional]
        return ", ".join(parts) or "no change"


def _widens(table_type: IcebergType, event_type: IcebergType) -> bool | None:
    """True: the table must widen to hold the event type; False: fits as is; None: incompatible."""
    if table_type == event_type:
        return False
    if isinstance(table_type, IntegerType) and isinstance(event_type, LongType):
        return True
    if isinstance(table_type, FloatType) and isinstance(event_type, DoubleType):
        return True
    if isinstance(table_type, LongType) and isinstance(event_type, IntegerType):
        return False
    if isinstance(table_type, DoubleType) and isinstance(event_type, FloatType):
        return False
    if isinstance(table_type, FixedType) and isinstance(event_type, BinaryType):
        return False  # Kafka Connect has no fixed-length bytes; a value of another length is a dead letter
    if isinstance(table_type, DecimalType) and isinstance(event_type, DecimalType):
        if table_type.scale != event_type.scale:
            return None
        return event_type.precision > table_type.precision
    return None


def _compare(evolution: Evolution, field_: NestedField, column: Column, key: bool) -> None:
    """One table field against the column the events carry for it. A list's element is compared as
    a column of its own (``tags.element``), which is also its path for the schema update."""
    if isinstance(field_.field_type, ListType) and column.is_list:
        _compare(evolution, field_.field_type.element_field, column.element(), key=False)
    else:
        widen = _widens(field_.field_type, column.type)
        if widen is None:
            evolution.incompatible.append(
                f"column {column.name}: the events carry {column.type} but the table has {field_.field_type}"
            )
        elif widen:
            evolution.widen.append((column.name, field_.field_type, column.type))
    if field_.required and not column.required and not key:
        evolution.make_optional.append(column.name)


def plan(schema: Schema, columns: list[Column]) -> Evolution:
    """Compare the table's schema with the columns one event schema carries."""
    evolution = Evolution()
    identifier = {schema.find_field(i).name for i in schema.identifier_field_ids}
    names = {c.name for c in columns}
    for column in columns:
        try:
            field_ = schema.find_field(column.name)
        except ValueError:
            evolution.add.append(column)
            continue
        _compare(evolution, field_, column, column.name in identifier)
    for field_ in schema.fields:
        if field_.name not in names and field_.required:
            if field_.name in identifier:
                evolution.incompatible.append(f"key column {field_.name} is missing from the events' schema")
            else:
                evolution.make_optional.append(field_.name)
    return evolution


def check(evolution: Evolution, policy: EvolutionPolicy, table: str) -> None:
    if evolution.incompatible:
        raise IncompatibleSchema(f"table {table}: " + "; ".join(evolution.incompatible))
    if evolution.changes and policy is EvolutionPolicy.STRICT:
        raise IncompatibleSchema(
            f"table {table}: the events' schema changed ({evolution.describe()}) and "
            "table.schema_evolution is strict"
        )


def apply(table: Table, evolution: Evolution) -> Table:
    """Evolve the table's schema (one metadata commit); returns the reloaded table."""
    if not evolution.changes:
        return table
    with table.update_schema() as update:
        for column in evolution.add:
            update.add_column(column.name, column.type, required=False)
        for name, _, new_type in evolution.widen:
            update.update_column(name, field_type=new_type)
        for name in evolution.make_optional:
            update.update_column(name, required=False)
    logger.info("evolved the schema of %s: %s", ".".join(table.name()), evolution.describe())
    return table.catalog.load_table(table.name())
