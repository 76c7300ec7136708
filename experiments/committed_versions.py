"""Past versions of a committed file, read from git history.

``results/`` keeps one canonical run per experiment; its earlier versions live in git history
(``git log -- results/<machine>/<experiment>``). Scripts that score across runs
(``scripts/noise_floor.py --history``, ``scripts/drift_rule_history.py``) read them here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)


def _locate(path: Path) -> tuple[Path, str]:
    """The checkout's top folder and ``path`` relative to it; ``LookupError`` outside git."""
    folder = path.parent if path.parent.is_dir() else Path.cwd()
    try:
        top = _git(folder, "rev-parse", "--show-toplevel")
    except FileNotFoundError as err:  # no git executable
        raise LookupError(f"{path}: git is not installed ({err})") from None
    if top.returncode != 0:
        raise LookupError(f"{path}: not inside a git checkout ({top.stderr.strip()})")
    root = Path(top.stdout.strip())
    try:
        return root, str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        raise LookupError(f"{path}: outside the checkout {root}") from None


def commits_of(path: Path, *, since: str | None = None) -> list[str]:
    """Short hashes of the commits that changed ``path`` (committed ``since`` a date, git's
    ``--since``, if given), newest first."""
    root, relative = _locate(path)
    out = _git(root, "log", "--format=%h", *([f"--since={since}"] if since else []), "--", relative)
    if out.returncode != 0:
        raise LookupError(f"{path}: git log failed ({out.stderr.strip()})")
    return out.stdout.split()


def version_at(path: Path, commit: str) -> str | None:
    """``path``'s text as of ``commit``; None where that commit has no such file (or deleted it)."""
    root, relative = _locate(path)
    out = _git(root, "show", f"{commit}:{relative}")
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def committed_versions(path: Path, *, since: str | None = None) -> list[tuple[str, str]]:
    """(short commit, text) of every committed version of ``path``, newest first; the commits
    that deleted it are left out."""
    versions = [(c, version_at(path, c)) for c in commits_of(path, since=since)]
    return [(c, text) for c, text in versions if text is not None]
