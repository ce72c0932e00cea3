"""SQLAlchemy engines: SQLite in the data dir by default, PostgreSQL by URL."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, Engine, Integer, MetaData, create_engine, event
from sqlalchemy.orm import DeclarativeBase

__all__ = ["STREAM_SEQ", "Base", "create_db_engine", "sqlite_url"]

# A JetStream sequence: 64-bit on PostgreSQL; plain INTEGER on SQLite (64-bit there too, and the only type an
# INTEGER PRIMARY KEY aliases to the rowid with).
STREAM_SEQ = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    """Declarative base of every projection table, so one metadata describes the whole schema."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{Path(data_dir).resolve() / 'opengyre.db'}"


def _sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    # Hand transaction control to SQLAlchemy (pysqlite's own breaks SAVEPOINT), WAL for a reader beside
    # the writer, and NORMAL sync: a crash loses no committed transaction in WAL mode.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def create_db_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return create_engine(url, pool_pre_ping=True, **kwargs)
