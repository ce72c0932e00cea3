"""The host side of grading a workspace the agent left: copying it for the grader, reading what the grader wrote.

The workspace is the agent's output, so every byte and every name in it is hostile. The copy
(``copy_workspace``) walks it with directory file descriptors, never following a symlink on the host, and
makes a tree the grader's own sandbox may then do anything with:

- regular files are copied by content (holes filled: a sparse file counts at its apparent size), opened with
  ``O_NOFOLLOW | O_NONBLOCK`` and checked with ``fstat`` to be what the scan saw; setuid, setgid and sticky bits
  are dropped;
- a regular file with more links than the workspace holds is a hard link to something outside it: left out;
- symlinks stay symlinks (the grader's namespace resolves them against only what it sees), except one that
  leads, as the grader would resolve it, into the grader's own directories (``/tests``, ``/logs``,
  ``/solution``) or into ``/proc``, ``/sys``, ``/dev/fd``: left out, so a planted ``out.txt -> /tests/expected``
  reads nothing of the answer key;
- FIFOs, sockets and device nodes are left out, as is a directory the agent made unreadable (the workspace
  itself included: it is then graded empty, never a failure of the host's);
- past ``max_bytes`` (apparent size), ``max_entries`` or ``max_depth`` the copy is refused
  (``WorkspaceTooLarge``) before it has written more than the bound.

``read_bounded`` reads one file the sandbox wrote (``reward.json``): relative to a directory opened without
following symlinks, only a regular file, at most ``limit`` bytes; a FIFO there does not block.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CopyBounds", "CopyReport", "UnsafeFileError", "WorkspaceTooLarge", "copy_workspace", "read_bounded"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
# Where the grader's sandbox keeps what the agent must not reach through a planted symlink, and the pseudo file
# systems through which a path can reach anything the grader's processes hold (/proc/self/root, /dev/fd/N).
_SEALED = ("/tests", "/logs", "/solution", "/proc", "/sys", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
_MAX_LINKS = 40  # symlinks followed while resolving one path, as the kernel's limit


class WorkspaceTooLarge(ValueError):
    """The workspace exceeds the grader's bounds; nothing of it is graded."""


class UnsafeFileError(ValueError):
    """A file the sandbox wrote is not a regular file of bounded size (a symlink, a FIFO, a directory...)."""


@dataclass(frozen=True)
class CopyBounds:
    max_bytes: int = 1 << 30  # apparent size of every regular file together
    max_entries: int = 100_000  # files, directories and symlinks
    max_depth: int = 64  # directory nesting

    def validate(self) -> None:
        if self.max_bytes < 0 or self.max_entries < 1 or self.max_depth < 1:
            raise ValueError("copy bounds must be max_bytes >= 0, max_entries >= 1, max_depth >= 1")


@dataclass
class CopyReport:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # "path (why)"
    stripped: list[str] = field(default_factory=list)  # files whose setuid/setgid/sticky bits were dropped


@dataclass
class _Scan:
    bounds: CopyBounds
    entries: int = 0
    size: int = 0
    links: dict[tuple[int, int], int] = field(default_factory=dict)  # inode -> names it has in the workspace

    def count(self, rel: str, st: os.stat_result) -> None:
        self.entries += 1
        if self.entries > self.bounds.max_entries:
            raise WorkspaceTooLarge(f"the workspace holds more than {self.bounds.max_entries} entries")
        if stat.S_ISREG(st.st_mode):
            self.size += st.st_size
            if self.size > self.bounds.max_bytes:
                raise WorkspaceTooLarge(f"the workspace's files exceed {self.bounds.max_bytes} bytes (at {rel})")
            key = (st.st_dev, st.st_ino)
            self.links[key] = self.links.get(key, 0) + 1


def _entries(fd: int) -> list[tuple[str, os.stat_result | None]]:
    """The directory's names with their ``lstat`` (None: it cannot be looked at, so it is not copied)."""
    out: list[tuple[str, os.stat_result | None]] = []
    with os.scandir(fd) as it:
        for e in it:
            try:
                out.append((e.name, os.stat(e.name, dir_fd=fd, follow_symlinks=False)))
            except FileNotFoundError:
                continue
            except OSError:
                out.append((e.name, None))
    return sorted(out, key=lambda x: x[0])


def _open_dir(name: str, fd: int) -> int | None:
    # A directory the agent made unreadable is left out, not a failure of the grading: an ungradeable workspace
    # would otherwise be an infrastructure failure, which training masks (a way out of a negative).
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except OSError:
        return None


def _scan(fd: int, rel: str, depth: int, scan: _Scan) -> None:
    if depth > scan.bounds.max_depth:
        raise WorkspaceTooLarge(f"the workspace nests directories deeper than {scan.bounds.max_depth} (at {rel})")
    for name, st in _entries(fd):
        path = posixpath.join(rel, name)
        if st is None:
            continue
        scan.count(path, st)
        if stat.S_ISDIR(st.st_mode) and (sub := _open_dir(name, fd)) is not None:
            try:
                _scan(sub, path, depth + 1, scan)
            finally:
                os.close(sub)


def copy_workspace(src: Path, dst: Path, bounds: CopyBounds | None = None, *, inside: str = "/app") -> CopyReport:
    """Copy the workspace ``src`` to the new directory ``dst``, which the grader will see at ``inside``.

    Raises ``WorkspaceTooLarge`` past the bounds (``dst`` may then hold a partial copy: the caller removes it),
    ``OSError`` where the host cannot read or write."""
    bounds = bounds or CopyBounds()
    bounds.validate()
    scan = _Scan(bounds)
    os.mkdir(dst, 0o700)
    report = CopyReport()
    try:
        src_fd = os.open(src, _DIR)
    except FileNotFoundError:
        return report  # no workspace left: the grader sees an empty one
    except PermissionError:
        # The agent's ``chmod 000 /app`` (its user is mapped onto the service's, which without root's DAC override
        # cannot read it then): left out like any directory it made unreadable. Raised, it would be the host's
        # failure to copy, a ``sandbox`` failure that training masks: a way out of every negative.
        report.skipped.append(". (the workspace itself cannot be read)")
        return report
    try:
        _scan(src_fd, "", 1, scan)
        dst_fd = os.open(dst, _DIR)
        try:
            _copy(src_fd, dst_fd, "", scan, report, inside, Path(src))
        finally:
            os.close(dst_fd)
        st = os.fstat(src_fd)
        os.chmod(dst, stat.S_IMODE(st.st_mode) & 0o777 | 0o700)
    finally:
        os.close(src_fd)
    return report


def _copy(src: int, dst: int, rel: str, scan: _Scan, report: CopyReport, inside: str, root: Path) -> None:
    """Reading the workspace may fail on what the agent made unreadable: that entry is left out. Writing the copy
    may fail only on the host's side (a full disk): that raises."""
    for name, seen in _entries(src):
        path = posixpath.join(rel, name)
        if seen is None:
            report.skipped.append(f"{path} (cannot be looked at)")
            continue
        mode = seen.st_mode
        if stat.S_ISDIR(mode):
            s = _open_dir(name, src)
            if s is None:
                report.skipped.append(f"{path} (a directory that cannot be read)")
                continue
            try:
                os.mkdir(name, 0o700, dir_fd=dst)
                d = os.open(name, _DIR, dir_fd=dst)
                try:
                    _copy(s, d, path, scan, report, inside, root)
                    # Owner access kept: the grader (and the cleanup) must be able to enter what it was given.
                    os.chmod(d, stat.S_IMODE(mode) & 0o777 | 0o700)
                    os.utime(d, ns=(seen.st_atime_ns, seen.st_mtime_ns))
                finally:
                    os.close(d)
            finally:
                os.close(s)
            report.dirs += 1
        elif stat.S_ISLNK(mode):
            try:
                target = os.readlink(name, dir_fd=src)
            except OSError:
                report.skipped.append(f"{path} (a symlink that cannot be read)")
                continue
            why = _sealed_target(root, posixpath.join(inside, path), target, inside)
            if why:
                report.skipped.append(f"{path} (symlink to {target}: {why})")
                continue
            os.symlink(target, name, dir_fd=dst)
            report.symlinks += 1
        elif stat.S_ISREG(mode):
            if scan.links.get((seen.st_dev, seen.st_ino), 0) < seen.st_nlink:
                report.skipped.append(f"{path} (a hard link to a file outside the workspace)")
                continue
            _copy_file(src, dst, name, path, seen, scan, report)
        else:
            report.skipped.append(f"{path} (not a regular file, directory or symlink)")


def _copy_file(src: int, dst: int, name: str, path: str, seen: os.stat_result, scan: _Scan, report: CopyReport) -> None:
    try:
        fd = os.open(name, _FILE, dir_fd=src)
    except OSError as exc:
        report.skipped.append(f"{path} (cannot be opened: {exc.strerror})")
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino):
            report.skipped.append(f"{path} (changed while copied)")
            return
        perm = stat.S_IMODE(st.st_mode)
        if perm & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
            report.stripped.append(path)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
        try:
            left = min(st.st_size, seen.st_size)  # a file that grew since the scan is cut where the bound saw it
            while left > 0:
                try:
                    chunk = os.read(fd, min(_CHUNK, left))
                except OSError as exc:  # the agent's file, not the host's failure: what was read stays
                    report.skipped.append(f"{path} (read cut at {st.st_size - left} bytes: {exc.strerror})")
                    break
                if not chunk:
                    break
                os.write(out, chunk)
                left -= len(chunk)
                report.bytes += len(chunk)
            os.fchmod(out, perm & 0o777)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
        report.files += 1
    finally:
        os.close(fd)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def _sealed_target(root: Path, link: str, target: str, inside: str) -> str:
    """Why the symlink at ``link`` (as the grader sees it) must not be kept, or "".

    Resolved as the grader's kernel would: components under ``inside`` against the workspace (``root``, whose
    symlinks the copy keeps or drops alike),
    the rest against the host's system directories, which the grader's sandbox shows read-only; every step is
    checked against the sealed directories. A path that cannot be resolved (a dangling link) is harmless."""
    pending = [*reversed(target.split("/"))]
    cur = "/" if target.startswith("/") else posixpath.dirname(link)
    followed = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        cur = posixpath.dirname(cur) if part == ".." else posixpath.join(cur, part)
        if _under(cur, _SEALED):
            return f"leads into {cur}"
        mine = cur == inside or cur.startswith(inside + "/")  # the workspace's own, else the system's
        host = root / posixpath.relpath(cur, inside) if mine else Path(cur)
        try:
            st = os.lstat(host)
        except (FileNotFoundError, NotADirectoryError):
            return ""  # dangling there, dangling for the grader
        except OSError as exc:  # a path too long to look at, a loop...: what cannot be followed here is not kept
            return f"cannot be resolved ({exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            followed += 1
            if followed > _MAX_LINKS:
                return "too many levels of symlinks"
            try:
                nxt = os.readlink(host)
            except OSError as exc:
                return f"cannot be resolved ({exc.strerror})"
            cur = "/" if nxt.startswith("/") else posixpath.dirname(cur)
            pending.extend(reversed(nxt.split("/")))
    return ""


def read_bounded(directory: Path, name: str, limit: int) -> bytes | None:
    """The content of ``directory/name`` written by a sandboxed command, or None when there is none.

    ``directory`` itself is opened without following a symlink (a grader may replace it with one), then ``name``
    relative to it: a symlink, FIFO, socket, device or directory there is ``UnsafeFileError``, as is a file over
    ``limit`` bytes. Nothing here blocks or reads past the limit."""
    try:
        dfd = os.open(directory, _DIR)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeFileError(f"{directory} is not a directory (a symlink or a file in its place)") from None
        raise
    try:
        try:
            fd = os.open(name, _FILE, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK):
                raise UnsafeFileError(f"{directory / name} is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeFileError(f"{directory / name} is not a regular file")
            if st.st_size > limit:
                raise UnsafeFileError(f"{directory / name} holds {st.st_size} bytes, over {limit}")
            data = bytearray()
            while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
                data += chunk
            if len(data) > limit:
                raise UnsafeFileError(f"{directory / name} grew past {limit} bytes")
            return bytes(data)
        finally:
            os.close(fd)
    finally:
        os.close(dfd)
