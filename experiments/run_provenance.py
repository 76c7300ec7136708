"""Which code a run measured, and when: ``details.run`` of every experiment's summary.json.

    {"commit": "75f2d93", "dirty": false, "finished_at": "2026-12-05T09:18:34+00:00"}

``commit`` is ``git rev-parse --short HEAD`` of the checkout the experiment's code lives in
(null outside a git checkout, e.g. an installed wheel); ``dirty`` says whether tracked files
other than ``profiles/`` and ``results/`` differed from that commit when the summary was written
(a paired run writes into the profile, a bench script into ``results/``: data, not code); ``finished_at`` is the UTC time the
summary was written. ``scripts/manifest.py`` reads the commit and the date from here, so a
committed run folder says where it came from by itself.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import Any

#: tracked paths a run may change without changing the code it measured
DATA_PATHS = ("profiles", "results")
REPO_ROOT = Path(__file__).resolve().parents[1]


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run_provenance(repo_root: Path = REPO_ROOT, now: dt.datetime | None = None) -> dict[str, Any]:
    """The commit of ``repo_root`` (None outside git), whether its code differs from it, and the time."""
    finished = (now or dt.datetime.now(dt.timezone.utc)).isoformat(timespec="seconds")
    commit = _git(["rev-parse", "--short", "HEAD"], repo_root)
    dirty = None
    if commit is not None:
        excluded = [f":(exclude){p}" for p in DATA_PATHS]
        status = _git(["status", "--porcelain", "--untracked-files=no", "--", ".", *excluded], repo_root)
        dirty = None if status is None else bool(status)
    return {"commit": commit, "dirty": dirty, "finished_at": finished}
