"""A measuring lock file the user names (``measure_lock.path``) is checked before any work:
a missing folder, an empty path, a folder or a file that cannot be opened are errors naming
the setting (issue 28), never a warning and a run without the lock."""

from __future__ import annotations

import logging

import pytest

import costmodel.store.locks as locks
from costmodel.measure.runtime import Runtime
from costmodel.store.locks import MeasureLockConfig, measuring


def _cfg(path):
    return {"device": "cpu", "dtype": "float32", "timing": {}, "limits": {"cpu": {"max_flops": 1, "max_bytes": 1}},
            "profile": {"root": "p"}, "measure_lock": {"mode": "wait", "timeout_s": 10, "path": path}}


def test_a_lock_path_in_a_missing_folder_is_refused_naming_the_setting(tmp_path):
    path = tmp_path / "no_such_dir" / "m.lock"
    default = locks.default_measure_lock_path()
    message = (f"measure_lock.path='{path}': its folder {path.parent} does not exist; create it (every process "
               f"measuring on this machine must use the same lock file), or set measure_lock.path=null for the "
               f"machine-wide {default}")
    with pytest.raises(ValueError) as err:
        Runtime.from_cfg(_cfg(str(path)))  # the config check every entry point runs before any work
    assert str(err.value) == message
    with pytest.raises(ValueError) as err:
        MeasureLockConfig(path=str(path))
    assert str(err.value) == message
    assert not path.parent.exists()  # not created


@pytest.mark.parametrize("value, message", [
    ("", "measure_lock.path must be a file path or null (null: the machine-wide {default}), got ''"),
    (5, "measure_lock.path must be a file path or null (null: the machine-wide {default}), got 5"),
    ("{tmp}", "measure_lock.path='{tmp}' is a folder; it must name a lock file (created if missing), or be null for "
              "the machine-wide {default}"),
])
def test_an_empty_path_or_a_folder_is_refused(tmp_path, value, message):
    value = value.format(tmp=tmp_path) if isinstance(value, str) else value
    with pytest.raises(ValueError) as err:
        MeasureLockConfig(path=value)
    assert str(err.value) == message.format(tmp=tmp_path, default=locks.default_measure_lock_path())


def test_a_named_lock_file_that_cannot_be_opened_is_an_error_not_a_warning(tmp_path, monkeypatch, caplog):
    path = tmp_path / "m.lock"

    def refuse(p, *, shared=False):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(locks, "_open_lock_file", refuse)
    ran = []
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError) as err:
        with measuring("bench", MeasureLockConfig(path=str(path))):
            ran.append(True)
    assert not ran  # nothing measured without the lock
    assert str(err.value) == (
        f"measure_lock.path='{path}': cannot open the lock file {path} (Permission denied); give a file every "
        f"measuring process here can open for writing, or set measure_lock.path=null for the machine-wide "
        f"{locks.default_measure_lock_path()}")
    # the default (machine-wide) lock file still falls back to measuring without it, with a warning
    with measuring("bench") as note:
        ran.append(True)
    assert ran == [True] and "Permission denied" in note["unavailable"]
    assert "measuring without it" in caplog.text
