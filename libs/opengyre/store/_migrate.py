"""Alembic migrations, run at start: the core's versions plus each service's own ``migrations`` folder."""

from __future__ import annotations

import importlib
import importlib.util
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

__all__ = ["MIGRATION_PACKAGES", "alembic_config", "migrate"]

# Packages that may hold a ``migrations/`` folder of Alembic revisions (each with its own branch label).
MIGRATION_PACKAGES = (
    "opengyre.store",
    "opengyre.synth",
    "opengyre.scheduler",
    "opengyre.proxy",
    "opengyre.trainer",
    "opengyre.bench",
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
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("version_locations", " ".join(_version_dirs()))
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# Alembic's command API keeps the running migration's environment in module globals (``alembic.context``): two
# threads migrating at once (two stacks started by one process) would run each other's steps.
_ONE_AT_A_TIME = threading.Lock()


def migrate(engine: Engine) -> None:
    """Bring the schema to every branch's head (idempotent)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with _ONE_AT_A_TIME, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "heads")
