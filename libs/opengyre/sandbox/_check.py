"""``opengyre sandbox check``: what each backend gives on this machine, found by running commands in it."""

from __future__ import annotations

import os
import socket
import sys
import threading

from ._base import SandboxError
from ._cgroup import memory_cgroup_parent, pids_cgroup_parent
from ._isolation import network_isolation_available
from ._limits import SandboxLimits
from ._local import ProcessSandbox, in_namespace_sandbox
from ._namespace import NamespaceSandbox, namespace_probe

__all__ = ["check_namespace", "check_none", "memory_mechanism", "process_limit_mechanism"]

_PROBE = (
    "import os; print(os.getuid()); print(len([p for p in os.listdir('/proc') if p.isdigit()])); "
    "print(','.join(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])); "
    "print(int(open('/proc/self/status').read().split('CapEff:')[1].split()[0], 16)); "
    "print(open('/proc/self/uid_map').read().split()[1]); "
    "print('writable' if os.access('/proc/sys/kernel/core_pattern', os.W_OK) else 'read-only')"
)


def process_limit_mechanism(namespace: bool) -> str:
    parent = pids_cgroup_parent()
    if parent is not None:
        return f"pids cgroup under {parent}"
    if os.geteuid() != 0:
        return "RLIMIT_NPROC" + (" inside the sandbox's user namespace" if namespace else " (counts the user's)")
    return "NONE: no pids cgroup can be made and the host's root is exempt from RLIMIT_NPROC"


def memory_mechanism() -> str:
    """Where the command's OOM kills are counted and whether a group's shared budget can be held here."""
    parent, pids = memory_cgroup_parent(), pids_cgroup_parent()
    if parent is not None and pids is not None:
        return f"a memory cgroup per command under {parent} (oom_kills counted there; memory_group budgets held)"
    return "NONE: no memory cgroup can be made (oom_kills are the machine's; a memory_group budget is refused)"


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(64).upper())

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def check_namespace() -> tuple[bool, list[str]]:
    if in_namespace_sandbox():
        return True, ["inside a namespace sandbox: commands run nested (process backend; the outer one isolates)"]
    ok, why = namespace_probe()
    if not ok:
        return False, [f"unavailable: {why}"]
    server, port = _echo_server()
    allowed = f"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'ping'); "
    allowed += "print(s.recv(64).decode())"
    try:
        with NamespaceSandbox(SandboxLimits(timeout_s=30), egress=[f"127.0.0.1:{port}"]) as sb:
            probe = sb.run([sys.executable, "-I", "-S", "-c", _PROBE])
            bridge = sb.run([sys.executable, "-I", "-S", "-c", allowed])
    except SandboxError as exc:
        return False, [f"unavailable: {exc}"]
    finally:
        server.close()
    if not probe.ok:
        return False, [f"a probe command failed: {probe.stderr.strip()[-300:]}"]
    uid, nprocs, interfaces, caps, host_uid, knobs = probe.stdout.split()
    lines = [
        "namespaces: user, mount, pid, ipc, uts, network, cgroup (bubblewrap)",
        f"uid inside: {uid} (the host's uid {host_uid}); capabilities: {caps}; processes visible: {nprocs}",
        f"kernel knobs (/proc/sys): {knobs}; /proc/kcore, keys, kallsyms, ... hidden",
        f"process limit: {process_limit_mechanism(True)}",
        f"memory: {memory_mechanism()}",
        "disk quota: RLIMIT_FSIZE per file + a watcher of the writable mounts' allocated blocks; /tmp a sized tmpfs",
        f"network: interfaces {interfaces} (loopback only); egress bridge: "
        + ("works" if bridge.ok and bridge.stdout.strip() == "PING" else f"FAILED ({bridge.stderr.strip()[-200:]})"),
    ]
    good = uid != "0" and interfaces == "lo" and bridge.ok and caps == "0" and knobs == "read-only"
    return good, lines


def check_none() -> tuple[bool, list[str]]:
    try:
        with ProcessSandbox(SandboxLimits(timeout_s=30)) as sb:
            probe = sb.run([sys.executable, "-I", "-S", "-c", _PROBE])
    except SandboxError as exc:
        return False, [f"unavailable: {exc}"]
    if not probe.ok:
        return False, [f"a probe command failed: {probe.stderr.strip()[-300:]}"]
    uid, nprocs, interfaces, *_ = probe.stdout.split()
    net = "a private network namespace (unshare -rn)" if network_isolation_available() else "the host's"
    return True, [
        "namespaces: none (the host's files and processes are visible; for trusted use or explicit opt-out)",
        f"uid: {uid} (the host user); processes visible: {nprocs}",
        f"process limit: {process_limit_mechanism(False)}",
        f"memory: {memory_mechanism()}",
        "disk quota: RLIMIT_FSIZE per file + a watcher of the writable directories' allocated blocks",
        f"network: {net} when network=False (interfaces {interfaces}); the host's with network=True",
    ]
