"""Trampoline: exec a program that dies with its parent.

``python -I -S _pdeath.py PARENT_PID SIGNAL PROGRAM [ARG...]`` asks the kernel to send SIGNAL to this process
when its parent dies (``prctl(PR_SET_PDEATHSIG)``, which survives ``exec``), checks the parent is still the one
that started it (it may have died before the prctl), then becomes PROGRAM. Run by path, never imported as part
of ``opengyre``: a bare interpreter starts in a few milliseconds. A ``preexec_fn`` would do the same without
the extra start, but is unsafe in a process with threads (gRPC, asyncio's executor), which the supervisor is.
"""

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    parent, sig, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.exit(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent:
        sys.exit(f"parent {parent} is gone; not starting {argv[0]}")
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
