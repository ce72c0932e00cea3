"""Migrations build exactly the schema the models declare, idempotently, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from opengyre.runtime import all_projections
from opengyre.store import Base, create_db_engine, migrate, set_aside_if_corrupt


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


def _fill(engine: Engine, rows: int) -> None:
    with engine.begin() as tx:
        tx.execute(text("CREATE TABLE IF NOT EXISTS filler (id INTEGER PRIMARY KEY, body TEXT)"))
        tx.execute(text("INSERT INTO filler (body) VALUES (:b)"), [{"b": "x" * 500} for _ in range(rows)])


def _aside(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith(("-wal", "-shm")))


@pytest.mark.parametrize("damage", ["garbage over the whole file", "garbage over pages inside it"])
def test_a_corrupt_sqlite_store_is_set_aside_and_a_fresh_one_migrated(tmp_path: Path, damage: str) -> None:
    """Issue 24 item 4: `up` used to exit with a SQLAlchemy traceback naming no file; only deleting it helped."""
    path = tmp_path / "db" / "trainer.db"
    path.parent.mkdir()
    engine = create_db_engine(f"sqlite:///{path}")
    migrate(engine)
    _fill(engine, 400)  # ~50 pages: damage inside it hits the table's b-tree
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    data = bytearray(path.read_bytes())
    if damage == "garbage over the whole file":
        data[:] = os.urandom(len(data))
    else:
        data[4096 * 3 : 4096 * 20] = os.urandom(4096 * 17)
    path.write_bytes(bytes(data))

    engine = create_db_engine(f"sqlite:///{path}")
    try:
        migrate(engine)
        aside = _aside(path)
        assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)  # kept as it was, never deleted
        names = set(inspect(engine).get_table_names())
        assert "og_tracking" in names and "filler" not in names  # a fresh, migrated store
        migrate(engine)  # sound now: nothing more set aside
        assert _aside(path) == aside
    finally:
        engine.dispose()


def test_a_sound_store_is_never_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    engine = create_db_engine(f"sqlite:///{path}")
    try:
        migrate(engine)
        _fill(engine, 50)
        assert set_aside_if_corrupt(engine) is None
        migrate(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM filler")).scalar() == 50
    finally:
        engine.dispose()
    assert _aside(path) == []
