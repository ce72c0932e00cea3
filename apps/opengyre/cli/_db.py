"""`opengyre db migrate`: bring the projection store to the current schema (compose runs it once)."""

from __future__ import annotations

import typer

from opengyre.console import DataDirOpt, DbUrlOpt, console, fail, settings_from

from ..runtime import DataDirUnusable, check_data_dir
from ..store import alembic_config, create_db_engine, migrate

__all__ = ["register"]


def migrate_cmd(data_dir: DataDirOpt = None, db_url: DbUrlOpt = None) -> None:
    """Run every service's Alembic migrations to head (in every service's store)."""
    settings = settings_from(data_dir, db_url=db_url)
    try:
        check_data_dir(settings.data_dir, create=True)
    except DataDirUnusable as exc:
        raise fail(str(exc)) from exc
    settings.ensure_store_dir()
    for url in dict.fromkeys(settings.store_urls().values()):
        engine = create_db_engine(url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        heads = alembic_config(url).get_main_option("version_locations") or ""
        console.print(
            f"migrated {engine.url.render_as_string(hide_password=True)} ({len(heads.split())} version folders)"
        )


def register(db_app: typer.Typer) -> None:
    db_app.command("migrate")(migrate_cmd)
