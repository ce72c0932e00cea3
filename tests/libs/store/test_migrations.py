"""Migrations build exactly the schema the models declare, idempotently, on SQLite and PostgreSQL."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect

from opengyre.runtime import all_projections
from opengyre.store import Base, migrate


def test_the_migrated_schema_equals_the_models(any_engine: Engine) -> None:
    all_projections()  # import every service's models into the shared metadata
    with any_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []


def test_migrating_twice_changes_nothing(any_engine: Engine) -> None:
    before = sorted(inspect(any_engine).get_table_names())
    migrate(any_engine)
    assert sorted(inspect(any_engine).get_table_names()) == before
    assert {"og_tracking", "og_dead_letters", "alembic_version"} <= set(before)


def test_every_projection_owns_migrated_tables(any_engine: Engine) -> None:
    names = set(inspect(any_engine).get_table_names())
    for projection in all_projections().values():
        for table in projection.tables:
            assert table.name in names, f"{projection.name}: {table.name} has no migration"
