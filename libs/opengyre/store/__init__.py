"""Projection storage: engines (SQLite default, PostgreSQL by URL), the shared declarative base, migrations."""

from ._engine import STREAM_SEQ, Base, create_db_engine, sqlite_url
from ._migrate import MIGRATION_PACKAGES, alembic_config, migrate, set_aside_if_corrupt
from ._tables import DeadLetter, TrackedStream, Tracking

__all__ = [
    "MIGRATION_PACKAGES",
    "STREAM_SEQ",
    "Base",
    "DeadLetter",
    "TrackedStream",
    "Tracking",
    "alembic_config",
    "create_db_engine",
    "migrate",
    "set_aside_if_corrupt",
    "sqlite_url",
]
