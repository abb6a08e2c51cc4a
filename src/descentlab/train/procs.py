"""Process bookkeeping for run directories and worker pools: is a recorded process still the one alive?

A pid alone is not an identity: after a process exits the kernel may give its pid to another one. On Linux
a process is named by ``pid`` and its start time (field 22 of ``/proc/<pid>/stat``, in clock ticks since
boot), so a lock or worker record left by a dead run never matches a newer process that got the same pid.
Elsewhere the start time is unknown and a live pid counts as the recorded process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def process_identity(pid: int) -> str | None:
    """The start time of ``pid`` (Linux), None where it cannot be read (the process is gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left
        return None
    return fields[19]


def process_alive(pid: int, identity: str | None) -> bool:
    """Whether ``pid`` runs, and (when ``identity`` is given and readable) is the same process as recorded."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    now = process_identity(pid)
    if sys.platform == "linux" and now is None:  # exited (a zombie) or vanished meanwhile
        return False
    return identity is None or now is None or now == identity


def die_with_parent(parent: int, *, poll: float = 0.1) -> None:
    """Make this (worker) process end within moments of ``parent``'s death, whatever signal ends the parent.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` asks the kernel to kill this process the moment the parent
    dies. SIGKILL, not SIGTERM: a worker inside ``fit`` turns SIGTERM into "checkpoint at the end of this
    step", which can take a whole step (seconds to minutes) while nobody is left to collect the result;
    what a SIGKILL cuts short is safe, since a checkpoint only becomes visible by its final rename and a
    resume continues from the newest complete one. Everywhere (and as a second line on Linux): a daemon
    thread polls ``os.getppid()`` every ``poll`` seconds and ends the process with ``os._exit`` once the
    parent is gone. The kernel's signal fires when the *thread* that started the worker exits, so start
    workers from a thread that lives as long as the pool (``JobRunner`` does: the caller's thread).
    """
    if sys.platform == "linux":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc / prctl: the watchdog below still covers it
            pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="descentlab-parent-watchdog", daemon=True).start()


__all__ = ["die_with_parent", "process_alive", "process_identity"]
