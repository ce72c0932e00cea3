"""Alembic migrations, run at start: the core's versions plus each service's own ``migrations`` folder.

A SQLite projection store that is not a database, or a damaged one, is set aside (never deleted: it is the user's
file) before migrating, and a fresh one takes its place: projections are folds of the log, so the service that
owns them rebuilds them from it, as it does a deleted file.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from ..config import installed_services

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["MIGRATION_PACKAGES", "alembic_config", "migrate", "set_aside_if_corrupt"]

log = logging.getLogger(__name__)

# SQLite's primary result codes for a file that is damaged (SQLITE_CORRUPT) or not a database at all
# (SQLITE_NOTADB). A locked or unreadable file is something else, and never set aside.
_CORRUPT_CODES = frozenset({11, 26})

# Packages that may hold a ``migrations/`` folder of Alembic revisions (each with its own branch label): the store's
# own and each installed service's (the package of its class, ``opengyre.<svc>.service:...`` -> ``opengyre.<svc>``).
MIGRATION_PACKAGES = (
    "opengyre.store",
    *(target.partition(":")[0].rpartition(".")[0] for target in installed_services().values()),
)

_HERE = Path(__file__).parent


def _version_dirs() -> list[str]:
    dirs: list[str] = []
    for pkg in MIGRATION_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        for loc in spec.submodule_search_locations:
            d = Path(loc) / "migrations" / "versions"
            if d.is_dir():
                dirs.append(str(d))
    return dirs


def alembic_config(url: str) -> Config:
    # alembic (~0.2 CPU-s over sqlalchemy, bench/import_cost.py) only once a command migrates, not in every CLI process
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("version_locations", " ".join(_version_dirs()))
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# Alembic's command API keeps the running migration's environment in module globals (``alembic.context``): two
# threads migrating at once (two stacks started by one process) would run each other's steps.
_ONE_AT_A_TIME = threading.Lock()


def _sqlite_problem(path: Path) -> str | None:
    """Why the SQLite file at ``path`` is damaged or no database (``PRAGMA quick_check``), or None."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=10)) as conn:
            rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _CORRUPT_CODES:
            return str(exc)
        raise
    if rows == [("ok",)]:
        return None
    return "; ".join(str(r[0]) for r in rows[:3])


def set_aside_if_corrupt(engine: Engine) -> Path | None:
    """A SQLite store that is no database or a damaged one is renamed ``<file>.corrupt-<UTC time>`` (its
    ``-wal``/``-shm`` beside it, renamed alike) and the engine disposed, so the next connection makes a fresh
    file. Where it went, or None when the store is sound (or not a SQLite file)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    path = Path(database)
    if not path.exists():
        return None
    why = _sqlite_problem(path)
    if why is None:
        return None
    engine.dispose()  # no pooled connection keeps writing to the file being moved
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.replace(aside.with_name(aside.name + suffix))
    path.replace(aside)
    log.error(
        "projection store %s is unreadable (%s): moved it to %s; its projections are rebuilt from the log",
        path,
        why,
        aside,
    )
    return aside


def migrate(engine: Engine) -> None:
    """Bring the schema to every branch's head (idempotent). A damaged SQLite store is set aside first
    (``set_aside_if_corrupt``) and a fresh one made in its place."""
    from alembic import command  # as in alembic_config: paid only where something migrates

    set_aside_if_corrupt(engine)
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with _ONE_AT_A_TIME, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "heads")
