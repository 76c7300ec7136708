"""Steady-state host allocator: keep freed memory in the process (glibc ``mallopt``).

By default glibc serves large allocations with fresh ``mmap`` pages and returns them on
free, so every forward pass that allocates a large tensor pays page faults; in a virtual
machine those faults are slow *and* noisy (on the 2-core development VM they added
10-40% to MoE layer latency, with run-to-run spread to match). A serving process reaches
a steady state instead, which is why PyTorch's CPU performance-tuning guide recommends a
caching allocator (jemalloc / tcmalloc). ``steady`` gets the same effect from glibc:
``M_MMAP_MAX = 0`` (never mmap) and a very high ``M_TRIM_THRESHOLD`` (never give the
heap back), see mallopt(3). It applies to CPU tensors only; CUDA has its own caching
allocator.

The mode is part of the device fingerprint: a profile measured under one allocator does
not predict runs under the other.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

ALLOCATOR_MODES = ("steady", "system")

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_applied: str | None = None


def configure_allocator(mode: str) -> str:
    """Apply ``mode`` to this process; returns the mode in effect ('system' where glibc's
    mallopt is unavailable). Once 'steady' is applied it stays for the process."""
    global _applied
    if mode not in ALLOCATOR_MODES:
        raise ValueError(f"allocator must be one of {list(ALLOCATOR_MODES)}, got {mode!r}")
    if mode == "system":
        return _applied or "system"
    if _applied == "steady":
        return "steady"
    if platform.system() != "Linux":
        return "system"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    except (OSError, AttributeError):
        ok = False
    _applied = "steady" if ok else None
    return _applied or "system"


def allocator_mode() -> str:
    return _applied or "system"
