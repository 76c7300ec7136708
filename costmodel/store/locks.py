"""Locks: one writer at a time per profile folder, one measuring process at a time per machine.

Two kinds, both advisory ``flock(2)`` locks on a small lock file (released by the kernel
when the holder exits or is killed, so a crash never leaves a stale lock behind), taken
with the ``filelock`` package:

- ``file_lock(path)``: exclusive, held only around a read-merge-write of a profile's files
  (well under a second): a ``filelock.FileLock``. Linux emulates ``flock`` with POSIX
  byte-range locks on NFS (``man 2 flock``, NOTES), so it also orders writers on different
  machines sharing a profile root over NFS.
- ``measuring(what, config)``: machine-wide (a lock file under the system temp dir,
  whatever the profile), held by a process while it times kernels or layers. A second
  measuring process on the same machine would share the cores and memory bandwidth and
  corrupt both sets of timings (two ``bench suite=quick`` at once measured peak 149 vs 361
  GFLOP/s and kernel medians 11x slower), so it waits (``mode: wait``, with a message naming
  the holder), refuses (``mode: refuse``) or, with ``mode: off``, measures anyway with a
  warning when it sees a holder. The holder writes who it is (pid, command, since when)
  into the lock file; a waiter reads that to say what it waits for. A lock file the user
  names (``measure_lock.path``) must be in an existing folder and openable: anything else is
  a ``ValueError`` naming the setting, before any measuring (only the default file under the
  system temp dir falls back to measuring without the lock, with a warning). It opens its
  lock file itself and locks the descriptor with ``filelock.lock_descriptor``: the default
  file in the sticky system temp dir is shared by every user of the machine, and
  ``filelock.FileLock`` refuses a lock file there that another user created.

The measuring lock is reentrant within a process (a bench that calibrates, an experiment
wrapping calibration and layer timing): the held lock is kept in a per-process table.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock, Timeout, lock_descriptor, unlock_descriptor

log = logging.getLogger(__name__)

MEASURE_LOCK_NAME = "moe-gnn-sim-measuring.lock"
MEASURE_MODES = ("wait", "refuse", "off")
POLL_S = 0.2  # how often a waiter retries a held lock
REPEAT_MESSAGE_S = 60.0  # a long wait repeats its message this often


class LockBusyError(RuntimeError):
    """Another process holds the lock (and this one refused, or waited past its timeout)."""


# ----------------------------------------------------------------------------- holder info


def _holder_record(what: str) -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv) or sys.executable,
            "what": what, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "since_epoch": time.time()}


def _write_holder(fd: int, what: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(_holder_record(what)) + "\n").encode(), 0)


def read_holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock at ``path``, as its holder wrote it (None when unknown)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder or "pid" not in holder:
        return "another process (it has not said who it is yet)"
    ago = max(0.0, time.time() - float(holder.get("since_epoch", time.time())))
    return (f"pid {holder['pid']} on {holder.get('host', '?')} ({holder.get('what', '?')}; command: "
            f"{holder.get('command', '?')}), since {holder.get('since', '?')} ({ago:.0f} s ago)")


# ----------------------------------------------------------------------------- plain file lock


def _open_lock_file(path: Path, *, shared: bool = False) -> int:
    """Open (creating) a lock file; ``shared``: usable by every user of the machine."""
    try:  # an existing file without O_CREAT: fs.protected_regular refuses O_CREAT on another
        return os.open(path, os.O_RDWR)  # user's file in a sticky directory such as /tmp
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    if shared:
        try:  # the umask may have narrowed it
            os.fchmod(fd, 0o666)
        except OSError:
            pass
    return fd


@contextmanager
def file_lock(path: str | Path, *, timeout_s: float = 120.0, what: str = "writing") -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` body.

    Waits up to ``timeout_s`` for another holder, then raises ``LockBusyError`` naming it.
    """
    path = Path(path)
    lock = FileLock(path, timeout=timeout_s, poll_interval=0.02, on_acquired=lambda fd: _write_holder(fd, what))
    try:
        lock.acquire()
    except Timeout:
        raise LockBusyError(f"could not lock {path} within {timeout_s:g} s: held by "
                            f"{describe_holder(read_holder(path))}") from None
    try:
        yield
    finally:
        with suppress(OSError):  # still held: no waiter reads a finished holder's record
            os.truncate(path, 0)
        lock.release()


# ----------------------------------------------------------------------------- measuring lock


@dataclass(frozen=True)
class MeasureLockConfig:
    """conf/base.yaml ``measure_lock``: what a measuring process does when another measures."""

    mode: str = "wait"  # wait: until the other finishes (up to timeout_s) | refuse: stop with a message | off
    timeout_s: float = 3600.0  # longest wait in mode wait (a full suite bench takes ~20 min on 2 cores)
    path: str | None = None  # lock file; None: <system temp dir>/moe-gnn-sim-measuring.lock (machine-wide)

    def __post_init__(self) -> None:
        if self.mode not in MEASURE_MODES:
            raise ValueError(f"measure_lock.mode must be one of {list(MEASURE_MODES)}, got {self.mode!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"measure_lock.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if self.path is not None:
            check_lock_path(self.path)

    @classmethod
    def from_cfg(cls, cfg: Any) -> "MeasureLockConfig":
        """From the ``measure_lock`` mapping (absent: the defaults)."""
        if cfg is None:
            return cls()
        if not hasattr(cfg, "get"):
            raise ValueError(f"measure_lock must be a mapping with mode, timeout_s, path; got {cfg!r}")
        unknown = set(cfg) - {"mode", "timeout_s", "path"}
        if unknown:
            raise ValueError(f"measure_lock: unknown keys {sorted(unknown)}; allowed: mode, timeout_s, path")
        path = cfg.get("path")
        return cls(mode=str(cfg.get("mode", "wait")), timeout_s=cfg.get("timeout_s", 3600.0),
                   path=None if path is None else str(path))

    def lock_path(self) -> Path:
        return Path(self.path) if self.path else default_measure_lock_path()


def check_lock_path(path: object) -> Path:
    """``measure_lock.path``, a user-given lock file: a non-empty path whose folder exists and
    that is not itself a folder. The folder is never created: a typo in it would otherwise give
    each process its own lock, and two measuring processes would not see each other."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"measure_lock.path must be a file path or null (null: the machine-wide "
                         f"{default_measure_lock_path()}), got {path!r}")
    file = Path(path)
    if not file.parent.is_dir():
        raise ValueError(f"measure_lock.path={path!r}: its folder {file.parent.absolute()} does not exist; create it "
                         f"(every process measuring on this machine must use the same lock file), or set "
                         f"measure_lock.path=null for the machine-wide {default_measure_lock_path()}")
    if file.is_dir():
        raise ValueError(f"measure_lock.path={path!r} is a folder; it must name a lock file (created if missing), "
                         f"or be null for the machine-wide {default_measure_lock_path()}")
    return file


def default_measure_lock_path() -> Path:
    """One lock per machine: the cores are shared whatever the profile."""
    return Path(tempfile.gettempdir()) / MEASURE_LOCK_NAME


_held_lock = threading.Lock()
_held: dict[str, list[int]] = {}  # lock path -> [fd, depth]: this process already measures


@contextmanager
def measuring(what: str, config: MeasureLockConfig | None = None) -> Iterator[dict[str, Any]]:
    """Hold the machine-wide measuring lock while the ``with`` body times kernels or layers.

    Yields a note for the profile's provenance: ``mode``, ``waited_s`` and, when other
    processes measured first, ``waited_for`` (who they were, in turn). Raises
    ``LockBusyError`` with the holder's pid, command and start time in mode ``refuse``, or
    after ``timeout_s`` in mode ``wait``. Reentrant within a process.
    """
    config = config or MeasureLockConfig()
    path = config.lock_path()
    key = str(path.absolute())
    with _held_lock:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
    if entry is not None:
        try:
            yield {"mode": config.mode, "waited_s": 0.0, "nested": True}
        finally:
            with _held_lock:
                entry[1] -= 1
        return

    note: dict[str, Any] = {"mode": config.mode, "lock": str(path), "waited_s": 0.0}
    try:
        fd = _open_lock_file(path, shared=config.path is None)
    except OSError as err:
        if config.path is not None:  # a lock file the user chose: refused, never silently skipped
            raise ValueError(f"measure_lock.path={config.path!r}: cannot open the lock file {path.absolute()} "
                             f"({err.strerror or err}); give a file every measuring process here can open for "
                             f"writing, or set measure_lock.path=null for the machine-wide "
                             f"{default_measure_lock_path()}") from None
        log.warning("cannot use the measuring lock %s (%s): measuring without it; set measure_lock.path "
                    "to a writable file to detect other measuring processes", path, err)
        note["unavailable"] = str(err)
        yield note
        return
    acquired = False
    try:
        acquired = lock_descriptor(fd, blocking=False)
        if not acquired:
            holder = describe_holder(read_holder(path))
            if config.mode == "off":
                log.warning("another process is measuring on this machine: %s. measure_lock.mode=off: measuring "
                            "anyway, so both processes' timings are disturbed", holder)
                note["disturbed_by"] = holder
            elif config.mode == "refuse":
                raise LockBusyError(
                    f"another process is measuring on this machine: {holder}. Two measuring processes disturb "
                    f"each other's timings, so this one stops ({what}); rerun when it has finished, or set "
                    f"measure_lock.mode=wait to wait for it (lock file {path})")
            else:
                acquired = _wait(fd, path, holder, what, config, note)
        if acquired:
            _write_holder(fd, what)
            with _held_lock:
                _held[key] = [fd, 1]
        yield note
    finally:
        if acquired:
            with _held_lock:
                _held.pop(key, None)
            os.ftruncate(fd, 0)
            unlock_descriptor(fd)
        os.close(fd)


def _wait(fd: int, path: Path, holder: str, what: str, config: MeasureLockConfig, note: dict[str, Any]) -> bool:
    """Poll until the lock is free; ``note["waited_for"]`` lists every holder seen meanwhile."""
    start = time.monotonic()
    log.warning("another process is measuring on this machine: %s. Waiting for it to finish before %s "
                "(up to measure_lock.timeout_s=%g s; measure_lock.mode=refuse stops instead)", holder, what,
                config.timeout_s)
    note["waited_for"] = [holder]
    last_pid = (read_holder(path) or {}).get("pid")
    last_message = start
    while not lock_descriptor(fd, blocking=False):
        now = time.monotonic()
        current = read_holder(path) or {}
        if now - start > config.timeout_s:
            raise LockBusyError(
                f"waited {now - start:.0f} s (measure_lock.timeout_s={config.timeout_s:g}) for another process "
                f"measuring on this machine: {describe_holder(current)}; rerun when it has finished "
                f"(lock file {path})")
        if current.get("pid") not in (None, last_pid):  # the first finished, another took its turn
            last_pid = current["pid"]
            note["waited_for"].append(describe_holder(current))
            log.warning("another process took its turn to measure: %s; still waiting", note["waited_for"][-1])
        elif now - last_message > REPEAT_MESSAGE_S:
            last_message = now
            log.warning("still waiting (%.0f s) for %s", now - start, describe_holder(current))
        time.sleep(POLL_S)
    note["waited_s"] = round(time.monotonic() - start, 3)
    log.warning("the other measuring process finished after %.1f s of waiting; measuring now", note["waited_s"])
    return True
