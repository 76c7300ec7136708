"""Per-user cache of fitted cost models: derived data, never read from a profile folder.

Why here and not beside the profile: a profile folder is shared data (one profile root
serves many terminals, users and machines on a shared file system), and fitted models are
pickles; unpickling a file runs whatever code its author put in it (``__reduce__``). So
nothing is ever unpickled from a profile folder: the models are derived from the profile's
measurements, fitted on first use and cached where only this user can write.

Where: ``$MOEGNN_MODEL_CACHE`` if set, else ``$XDG_CACHE_HOME/moe-gnn-sim/models``, else
``~/.cache/moe-gnn-sim/models``; created with mode 0700. A cache folder or entry that is not
owned by this user, or that group or others may write, is refused with a
``ModelCacheWarning``: nothing is read from it or written to it, and the models are fitted in
memory instead (correct, only slower).

Key: ``<fingerprint id>-<profile content hash>-v<MODEL_VERSION>-sklearn<version>.joblib``.
An entry never goes stale: a profile that changed has another content hash, a code change
to the kernel features bumps ``MODEL_VERSION``, another scikit-learn another name; entries
nobody asks for any more are simply left unused (delete the folder at will). Entries are
written atomically (temp file in the same folder, then ``os.replace``), so concurrent fits
of one profile leave one complete entry.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import joblib
import sklearn

ENV = "MOEGNN_MODEL_CACHE"
SUFFIX = ".joblib"


class ModelCacheWarning(UserWarning):
    """The model cache was refused or failed (the models are fitted in memory), or a
    profile folder holds a leftover pickle that is ignored."""


def cache_dir() -> Path:
    """The configured cache folder (it may not exist yet)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "moe-gnn-sim" / "models"


def entry_name(fingerprint_id: str, content_hash: str, model_version: int) -> str:
    """The cache file name of one profile's models (characters outside [A-Za-z0-9._-] replaced:
    the fingerprint comes from a shared file)."""
    raw = f"{fingerprint_id}-{content_hash}-v{model_version}-sklearn{sklearn.__version__}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:200] + SUFFIX


def _unsafe(st: os.stat_result, what: str, path: Path) -> str | None:
    """Why ``st`` may not be trusted (None when it may): another owner, or writable by others."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid != uid:
        return f"{what} {path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _refuse(reason: str) -> None:
    warnings.warn(f"model cache refused: {reason}; the cost models are fitted in memory and not cached "
                  f"(set {ENV} to a folder only you can write, e.g. one made with mode 0700)",
                  ModelCacheWarning, stacklevel=3)


def usable_dir(*, create: bool) -> Path | None:
    """The cache folder if it is safe to use (created 0700 when ``create``), else None (with a
    ``ModelCacheWarning`` when it exists but is unsafe)."""
    path = cache_dir()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return None
        try:
            path.mkdir(parents=True, mode=0o700, exist_ok=True)
            st = os.stat(path)
        except OSError as err:
            warnings.warn(f"cannot create the model cache {path} ({err}); the cost models are not cached",
                          ModelCacheWarning, stacklevel=3)
            return None
    except OSError as err:
        warnings.warn(f"cannot read the model cache {path} ({err}); the cost models are not cached",
                      ModelCacheWarning, stacklevel=3)
        return None
    if not stat.S_ISDIR(st.st_mode):
        _refuse(f"{path} is not a folder")
        return None
    reason = _unsafe(st, "folder", path)
    if reason:
        _refuse(reason)
        return None
    return path


def read(name: str) -> Any | None:
    """The object cached under ``name``, or None (a miss, an unsafe entry, an unreadable one)."""
    folder = usable_dir(create=False)
    if folder is None:
        return None
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as err:  # a symlink (O_NOFOLLOW) or unreadable: never followed
        _refuse(f"entry {path} cannot be opened safely ({err.strerror or err})")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())  # the file actually opened, not a name checked earlier
        reason = None if stat.S_ISREG(st.st_mode) else f"entry {path} is not a regular file"
        reason = reason or _unsafe(st, "entry", path)
        if reason:
            _refuse(reason)
            return None
        try:
            return joblib.load(f)
        except Exception as err:  # written by other library versions, truncated...: refit, overwrite
            warnings.warn(f"model cache entry {path} cannot be read ({type(err).__name__}: {err}); refitting",
                          ModelCacheWarning, stacklevel=2)
            return None


def write(name: str, obj: Any) -> Path | None:
    """Store ``obj`` under ``name`` atomically (mode 0600); the entry's path, or None when the
    cache is refused or cannot be written (a warning says why)."""
    folder = usable_dir(create=True)
    if folder is None:
        return None
    path = folder / name
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")  # mode 0600
    except OSError as err:
        warnings.warn(f"cannot write the model cache {folder} ({err}); the cost models are not cached",
                      ModelCacheWarning, stacklevel=2)
        return None
    try:
        with os.fdopen(fd, "wb") as f:
            joblib.dump(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a folder removed meanwhile: the models still work, uncached
        Path(tmp).unlink(missing_ok=True)
        warnings.warn(f"cannot write the model cache entry {path} ({err}); the cost models are not cached",
                      ModelCacheWarning, stacklevel=2)
        return None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
