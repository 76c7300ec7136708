"""The steady allocator asks glibc never to mmap and never to trim the heap."""

from __future__ import annotations

import platform

import pytest

from costmodel.measure import allocator


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


def test_steady_disables_mmap_and_trimming(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.platform, "system", lambda: "Linux")
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: fake)
    assert allocator.configure_allocator("steady") == "steady"
    # M_MMAP_MAX = 0; M_TRIM_THRESHOLD = -1 (never trim: a finite 2^31 - 1 let 3 GiB frees go
    # back to the OS, and refaulting them made the next MoE block 4.5x slower)
    assert fake.calls == [(-4, 0), (-1, -1)]


def test_unknown_mode_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"allocator must be one of \['steady', 'system'\]"):
        allocator.configure_allocator("jemalloc")


@pytest.mark.skipif(platform.system() != "Linux", reason="glibc only")
def test_system_mode_changes_nothing_once_steady():
    assert allocator.configure_allocator("system") in ("system", "steady")
