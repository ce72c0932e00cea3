"""The worker's command line: it trains through ``--train`` or says it is the stand-in; nothing in between."""

from __future__ import annotations

import pytest

from opengyre.scheduler.worker import main

BASE = ["--cell", "c1", "--scheduler", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "give one of --train module:function or --stand-in"),
        (["--train", "json:dumps", "--stand-in"], "give one of --train module:function or --stand-in"),
        (["--train", "json:dumps", "--micro-step-s", "1"], "needs --stand-in"),
        (["--stand-in", "--micro-step-s", "-1"], "must be >= 0"),
    ],
    ids=["neither", "both", "hold-time-without-stand-in", "negative-hold-time"],
)
def test_a_worker_that_would_train_nothing_without_saying_so_is_refused(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *extra])
    assert exc.value.code == 2 and says in capsys.readouterr().err
