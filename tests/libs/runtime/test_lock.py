"""The data dir is private to its user, whoever made it first."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from opengyre.runtime import DataDirLock


def test_a_data_dir_made_before_with_the_umasks_mode_is_narrowed_to_its_user(tmp_path: Path) -> None:
    data = tmp_path / "og"
    data.mkdir()
    os.chmod(data, 0o755)  # as `mkdir` by hand (or an older build) leaves it under a 022 umask
    lock = DataDirLock(data)  # what `up`, and every command that serves the store, takes first
    lock.acquire("up")
    try:
        # The stores, logs and tasks' solutions under it are made with the umask's mode (0644): only the data
        # dir's own mode keeps other local users out of them.
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
    finally:
        lock.release()
