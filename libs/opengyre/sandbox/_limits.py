"""What a sandboxed command may use, and what came back."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SandboxLimits", "SandboxResult"]


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 600.0  # wall clock; the whole process tree is killed past it (exit 124)
    memory_mb: int | None = 2048  # address-space limit per process (RLIMIT_AS)
    cpu_s: int | None = None  # CPU seconds (RLIMIT_CPU)
    max_output_bytes: int = 1 << 20  # stdout and stderr are each cut to this many bytes
    # False: no network (the namespace backend: loopback only, plus the sandbox's egress endpoints; the process
    # backend: a private network namespace where the OS allows one). True: the host's network, which only the
    # process backend (``none``) gives; the namespace backend refuses it.
    network: bool = False
    # Processes (and threads) of the command's tree together: a pids cgroup where one can be made, else
    # RLIMIT_NPROC (inside the sandbox's user namespace under the namespace backend); ``sandbox check`` says which.
    # Bounded by default: a fork bomb must end at the sandbox, not at the machine's limit.
    max_processes: int | None = 512
    limiter: str = "auto"  # "prlimit", "ulimit" (a POSIX shell's builtin), or "auto" (prlimit where installed)
    # Resident memory of all the command's processes together: past it the sandbox kills them all (SIGKILL)
    # and says so (``memory_exceeded``), as a cgroup's memory.max would. Polled every ``memory_poll_s`` from
    # /proc; None: no such limit (each process is still bound by ``memory_mb``).
    group_memory_mb: int | None = None
    memory_poll_s: float = 0.05
    # A name the commands of several sandboxes share (the rollouts of one group): their memory cgroups nest in one
    # cgroup of that name limited to ``group_memory_mb`` (the kernel's limit: a budget they share, not one each).
    # Refused (SandboxError) where this process cannot make memory cgroups. None: each command its own budget.
    memory_group: str | None = None
    # Disk the command may fill: RLIMIT_FSIZE bounds each file it writes, and the blocks allocated under the
    # sandbox's writable directories (its root and writable mounts) are summed every ``disk_poll_s``: past the
    # quota every process is killed and the result says so (``disk_exceeded``). None: no quota.
    disk_mb: int | None = 4096
    disk_poll_s: float = 0.25
    # Connections to the sandbox's egress endpoints relayed at a time (the sandbox's, taken from the limits it was
    # made with): one past it is closed at once. None: no bound.
    max_egress_connections: int | None = 64

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        if self.memory_mb is not None and self.memory_mb < 16:
            raise ValueError("memory_mb must be >= 16")
        if self.limiter not in ("auto", "prlimit", "ulimit"):
            raise ValueError("limiter must be auto, prlimit or ulimit")
        if self.group_memory_mb is not None and (self.group_memory_mb < 16 or not self.memory_poll_s > 0):
            raise ValueError("group_memory_mb must be >= 16 and memory_poll_s > 0")
        if self.memory_group is not None and (self.group_memory_mb is None or not self.memory_group):
            raise ValueError("memory_group needs group_memory_mb (the budget its commands share) and a name")
        if self.max_processes is not None and self.max_processes < 1:
            raise ValueError("max_processes must be >= 1")
        if self.disk_mb is not None and (self.disk_mb < 1 or not self.disk_poll_s > 0):
            raise ValueError("disk_mb must be >= 1 and disk_poll_s > 0")
        if self.max_egress_connections is not None and self.max_egress_connections < 1:
            raise ValueError("max_egress_connections must be >= 1")
        if self.max_output_bytes < 0:
            raise ValueError("max_output_bytes must be >= 0")


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int  # shell convention: 128 + signal for a signalled process (137 = SIGKILL), 124 on timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    network_isolated: bool  # whether the command ran without the host's network
    # The sandbox killed the command's processes because together they held more than ``group_memory_mb``.
    memory_exceeded: bool = False
    # The signal that ended the command itself when no limit of the sandbox did (9: a SIGKILL from outside the
    # sandbox, such as the system's OOM killer); None when it exited, timed out or exceeded its memory.
    signal: int | None = None
    # The sandbox killed the command's processes because its writable directories held more than ``disk_mb``.
    disk_exceeded: bool = False
    # Which isolation ran the command: the backend's name ("namespace", "none", ...), or "nested" for a command
    # run inside another of our namespace sandboxes (the outer one's isolation holds; limits and reaper apply).
    isolation: str = ""
    # OOM kills the kernel counted while the command ran, of its own processes where it has a memory cgroup, else
    # on the whole machine (``oom_kill`` in /proc/vmstat; None where neither can be read): 0 says a ``signal`` 9
    # was not the OOM killer's, so something else sent it, such as the command's own processes, which may kill
    # each other (same user, same sandbox).
    oom_kills: int | None = None
    # What ``oom_kills`` counted: "cgroup" (the command's own memory cgroup: its processes' OOM kills alone),
    # "machine" (``/proc/vmstat``: any process's, the Docker backend's and wherever no memory cgroup can be made),
    # "" (not counted).
    oom_kills_scope: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr
