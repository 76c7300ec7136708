"""Steady-state host allocator: keep freed memory in the process (glibc ``mallopt``).

By default glibc serves large allocations with fresh ``mmap`` pages and returns them on
free, so every forward pass that allocates a large tensor pays page faults; in a virtual
machine those faults are slow *and* noisy (on the 2-core development VM they added
10-40% to MoE layer latency, with run-to-run spread to match). A serving process reaches
a steady state instead, which is why PyTorch's CPU performance-tuning guide recommends a
caching allocator (jemalloc / tcmalloc). ``steady`` gets the same effect from glibc:
``M_MMAP_MAX = 0`` (never mmap) and ``M_TRIM_THRESHOLD = -1`` (mallopt(3): "disables
trimming completely", so the heap is never given back). A finite threshold is not enough:
with it at 2^31 - 1, transformers' batched_mm experts (3 GiB of gathered weights a call)
freed more than 2 GiB at the heap top, glibc returned it, and the next MoE block refaulted
its memory at 238 ms a call instead of 53 ms on the development VM. It applies to CPU
tensors only; CUDA has its own caching allocator.

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
NEVER_TRIM = -1  # glibc reads it as SIZE_MAX: no free is ever large enough to trim
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
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    except (OSError, AttributeError):
        ok = False
    _applied = "steady" if ok else None
    return _applied or "system"


def allocator_mode() -> str:
    return _applied or "system"
