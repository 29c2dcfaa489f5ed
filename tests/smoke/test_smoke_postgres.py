"""Postgres: SQLAlchemy 2 + psycopg 3 reach the dev database and can create, write and read a table."""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa


def test_sqlalchemy_psycopg_roundtrip(pg_dsn: str, unique_name: Callable[[str], str]) -> None:
    assert pg_dsn.startswith("postgresql+psycopg://")
    engine = sa.create_engine(pg_dsn)
    table = unique_name("smoke")
    try:
        with engine.begin() as conn:
            assert conn.execute(sa.text("SELECT current_database()")).scalar_one() == "icesink"
            conn.execute(sa.text(f"CREATE TABLE {table} (id int PRIMARY KEY, payload jsonb NOT NULL)"))
            conn.execute(
                sa.text(f"INSERT INTO {table} VALUES (:id, CAST(:payload AS jsonb))"),
                [{"id": 1, "payload": '{"a": 1}'}, {"id": 2, "payload": '{"b": [1, 2]}'}],
            )
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT id, payload FROM {table} ORDER BY id")).all()
        assert [tuple(r) for r in rows] == [(1, {"a": 1}), (2, {"b": [1, 2]})]
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()
