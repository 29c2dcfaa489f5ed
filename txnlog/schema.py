"""Table definitions and versioned, idempotent schema creation.

Migrations are plain SQL applied in order under a transaction-scoped advisory lock, so any number
of processes can start against an empty database at once: the first creates the tables, the others
wait for the lock, then see the recorded version and do nothing. ``schema_version`` records every
applied version; code that finds a version newer than it knows refuses to run rather than writing
rows a newer layout may not accept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from txnlog.errors import SchemaVersionError

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def validate_schema_name(schema: str) -> str:
    """Accept only plain lower-case identifiers: the name is interpolated into DDL."""
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"invalid schema name {schema!r}: use [a-z_][a-z0-9_]*, at most 63 characters")
    return schema


@dataclass(frozen=True)
class Tables:
    schema: str
    metadata: MetaData
    sinks: Table
    history: Table
    schema_version: Table


def tables(schema: str) -> Tables:
    """SQLAlchemy Core tables for ``schema``; they mirror the latest migration below."""
    validate_schema_name(schema)
    md = MetaData(schema=schema)
    sinks = Table(
        "sinks",
        md,
        Column("sink_id", Text, primary_key=True),
        Column("epoch", BigInteger, nullable=False),
        Column("owner", Text, nullable=False),
        Column("claim_token", Uuid, nullable=False),
        Column("phase", Text, nullable=False),
        Column("seq", BigInteger, nullable=False),
        Column("payload", JSONB(none_as_null=True)),
        Column("precommit_epoch", BigInteger),
        Column("committed_seq", BigInteger),
        Column("committed_epoch", BigInteger),
        Column("committed_payload", JSONB(none_as_null=True)),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("claimed_at", DateTime(timezone=True), nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False),
    )
    history = Table(
        "history",
        md,
        Column("id", BigInteger, primary_key=True),
        Column("sink_id", Text, nullable=False),
        Column("at", DateTime(timezone=True), nullable=False),
        Column("action", Text, nullable=False),
        Column("epoch", BigInteger, nullable=False),
        Column("owner", Text, nullable=False),
        Column("seq", BigInteger),
        Column("phase", Text, nullable=False),
        Column("payload", JSONB(none_as_null=True)),
    )
    schema_version = Table(
        "schema_version",
        md,
        Column("version", Integer, primary_key=True),
        Column("description", Text, nullable=False),
        Column("applied_at", DateTime(timezone=True), nullable=False),
    )
    return Tables(schema, md, sinks, history, schema_version)


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]  # ``{s}`` is replaced by the quoted schema name


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "sinks and history tables",
        (
            """
            CREATE TABLE {s}.sinks (
                sink_id           text PRIMARY KEY,
                epoch             bigint NOT NULL CHECK (epoch > 0),
                owner             text NOT NULL,
                claim_token       uuid NOT NULL,
                phase             text NOT NULL CHECK (phase IN ('idle', 'precommit', 'committed')),
                seq               bigint NOT NULL DEFAULT 0 CHECK (seq >= 0),
                payload           jsonb,
                precommit_epoch   bigint,
                committed_seq     bigint,
                committed_epoch   bigint,
                committed_payload jsonb,
                created_at        timestamptz NOT NULL DEFAULT now(),
                claimed_at        timestamptz NOT NULL DEFAULT now(),
                updated_at        timestamptz NOT NULL DEFAULT now(),
                CONSTRAINT precommit_has_plan
                    CHECK (phase <> 'precommit' OR (payload IS NOT NULL AND precommit_epoch IS NOT NULL)),
                CONSTRAINT committed_has_plan
                    CHECK (phase <> 'committed'
                           OR (committed_seq IS NOT NULL AND committed_epoch IS NOT NULL)),
                CONSTRAINT committed_not_ahead CHECK (committed_seq IS NULL OR committed_seq <= seq),
                CONSTRAINT epochs_not_ahead CHECK (
                    coalesce(precommit_epoch, 0) <= epoch AND coalesce(committed_epoch, 0) <= epoch)
            )
            """,
            """
            CREATE TABLE {s}.history (
                id       bigserial PRIMARY KEY,
                sink_id  text NOT NULL,
                at       timestamptz NOT NULL DEFAULT clock_timestamp(),
                action   text NOT NULL CHECK (action IN ('claim', 'precommit', 'commit', 'abort')),
                epoch    bigint NOT NULL,
                owner    text NOT NULL,
                seq      bigint,
                phase    text NOT NULL,
                payload  jsonb
            )
            """,
            "CREATE INDEX history_sink_id_id ON {s}.history (sink_id, id)",
        ),
    ),
)
LATEST_VERSION = MIGRATIONS[-1].version

# Waiting for another process's migration is expected at startup; do not let a short
# operational lock_timeout turn that into an error.
_MIGRATION_LOCK_TIMEOUT = "60s"


def _quoted(schema: str) -> str:
    return '"' + validate_schema_name(schema) + '"'


def current_version(conn: Connection, schema: str) -> int | None:
    """The highest applied version, or None when the version table does not exist yet."""
    exists = conn.execute(
        text("SELECT to_regclass(:name) IS NOT NULL"), {"name": f"{_quoted(schema)}.schema_version"}
    ).scalar_one()
    if not exists:
        return None
    version = conn.execute(text(f"SELECT max(version) FROM {_quoted(schema)}.schema_version")).scalar_one()
    return int(version) if version is not None else 0


def _check_known(version: int | None, schema: str) -> None:
    if version is not None and version > LATEST_VERSION:
        raise SchemaVersionError(
            f"schema {schema!r} is at version {version}, newer than this code's {LATEST_VERSION}; "
            "upgrade icesink before pointing it at this database"
        )


def ensure_schema(conn: Connection, schema: str) -> int:
    """Create or migrate ``schema`` to :data:`LATEST_VERSION`; returns the version now in place.

    ``conn`` must be inside a transaction; the caller commits it. Safe to call concurrently.
    """
    version = current_version(conn, schema)
    _check_known(version, schema)
    if version == LATEST_VERSION:
        return version

    s = _quoted(schema)
    conn.execute(text(f"SET LOCAL lock_timeout = '{_MIGRATION_LOCK_TIMEOUT}'"))
    conn.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
        {"key": f"icesink.txnlog.schema:{schema}"},
    )
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {s}"))
    conn.execute(
        text(
            f"""
            CREATE TABLE IF NOT EXISTS {s}.schema_version (
                version     integer PRIMARY KEY,
                description text NOT NULL,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """
        )
    )
    version = current_version(conn, schema) or 0  # re-read: another process may have migrated
    _check_known(version, schema)
    for migration in MIGRATIONS:
        if migration.version <= version:
            continue
        for statement in migration.statements:
            conn.execute(text(statement.format(s=s)))
        conn.execute(
            text(f"INSERT INTO {s}.schema_version (version, description) VALUES (:v, :d)"),
            {"v": migration.version, "d": migration.description},
        )
        version = migration.version
    return version
