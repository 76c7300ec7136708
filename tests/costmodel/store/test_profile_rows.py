"""Row validation of measurements.csv: a damaged row is named by file:line and never fitted on."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.store.profile import DeviceProfile, ProfileError
from costmodel.store.profile_rows import read_rows

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = sorted((ROOT / "profiles").glob("*/measurements.csv"))


def _row(m: int, round_: int = 0, median_s: float = 1.0418e-05) -> dict:
    spec = GemmSpec(m, 64, 64)
    iqr_s = 0.05 * median_s
    return {"key": spec.key(), "round": round_, **spec.to_record(), "tag": "grid", "flops": spec.flops(),
            "bytes_moved": spec.bytes_moved(), "median_s": median_s, "iqr_s": iqr_s, "mean_s": 1.02 * median_s,
            "cv": 0.04, "rel_iqr": iqr_s / median_s, "runs": 9, "number_per_run": 100, "attempts": 1,
            "noisy": False, "threads": 2, "suite": "test", "measured_at": "2026-11-30T12:00:00"}


@pytest.fixture
def csv_file(tmp_path):
    """A valid profile table of 4 GEMM rows (lines 2..5), as the profile writes it."""
    profile = DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))
    profile.append_measurements([_row(m) for m in (1, 2, 4, 8)])
    return profile.path / "measurements.csv"


def _edit(file: Path, line: int, old: str, new: str) -> None:
    lines = file.read_text().split("\n")
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    file.write_text("\n".join(lines))


def test_a_valid_table_loads_whole(csv_file):
    frame, rejected = read_rows(csv_file)
    assert len(frame) == 4 and rejected == []
    assert str(frame["round"].dtype) == "int64" and frame["noisy"].dtype == bool


@pytest.mark.parametrize("cut_after", ["1.0418", "1.0418e-"])
def test_a_file_cut_inside_a_number_rejects_that_row(csv_file, cut_after):
    text = csv_file.read_text()
    last_number = text.rindex("1.0418e-05")  # the median of the last row (line 5)
    csv_file.write_text(text[: last_number + len(cut_after)])
    frame, rejected = read_rows(csv_file)
    assert len(frame) == 3 and GemmSpec(8, 64, 64).key() not in set(frame["key"])
    (bad,) = rejected
    assert bad.line == 5 and "cut short" in bad.reason
    assert bad.describe().startswith(f"{csv_file}:5: has ")


@pytest.mark.parametrize(
    "line, old, new, reason",
    [
        (3, ",0,gemm,", ",zero,gemm,", "round='zero' is not a number"),
        (3, ",0,gemm,", ",-1,gemm,", "round=-1.0 is out of range (must be an integer >= 0)"),
        (4, "1.0418e-05,", "1.0418,", "rel_iqr="),  # a median cut to 1.0418 in a full-length row
        (4, "1.0418e-05,", "1.0418e-,", "median_s='1.0418e-' is not a number"),
        (2, "1.0418e-05,", ",", "median_s is empty"),
        (5, ",9,100,", ",0,100,", "runs=0.0 is out of range"),
        (2, ",False,", ",maybe,", "noisy='maybe' is not True or False"),
        (3, ",gemm,2,64,", ",gemm,2000,64,", "is not the key of the row's own descriptor fields"),
        (3, ",gemm,2,64,", ",gemm,0,64,", "GemmSpec.m must be a positive integer"),
        (3, ",gemm,2,64,", ",gemm,,64,", "m is empty (a gemm descriptor field)"),
        (3, ",gemm,2,64,", ",conv,2,64,", "family='conv' is not a kernel family"),
    ],
)
def test_a_damaged_row_is_rejected_with_file_line_and_reason(csv_file, line, old, new, reason):
    _edit(csv_file, line, old, new)
    frame, rejected = read_rows(csv_file)
    assert len(frame) == 3
    (bad,) = rejected
    assert bad.line == line and reason in bad.reason, bad.reason
    assert str(csv_file) == bad.file


def test_a_median_inconsistent_with_the_mean_is_rejected(csv_file):
    # median cut to 1.0418 s with rel_iqr made to agree: only median <= 2 * mean can catch it
    _edit(csv_file, 2, "1.0418e-05,5.209e-07,1.062636e-05,0.04,0.05,",
          f"1.0418,5.209e-07,1.062636e-05,0.04,{5.209e-07 / 1.0418!r},")
    frame, rejected = read_rows(csv_file)
    (bad,) = rejected
    assert bad.line == 2 and "median_s=1.0418 exceeds twice mean_s=1.062636e-05" in bad.reason
    assert (frame["median_s"] < 1e-3).all()


def test_a_repeated_kernel_and_round_keeps_the_later_row(csv_file):
    lines = csv_file.read_text().rstrip("\n").split("\n")
    csv_file.write_text("\n".join([*lines, lines[1].replace("1.0418e-05", "2.0836e-05", 1)
                                   .replace(",5.209e-07,", ",1.0418e-06,")]) + "\n")
    frame, rejected = read_rows(csv_file)
    assert len(frame) == 4
    (dup,) = rejected
    assert dup.line == 2 and "duplicate of line 6" in dup.reason


def test_fitting_never_sees_a_rejected_row(csv_file, caplog):
    profile = DeviceProfile.load(csv_file.parent)
    _edit(csv_file, 4, "1.0418e-05,", "1.0418,")
    kernels = profile.kernels()
    assert len(kernels) == 3 and kernels["median_s"].max() < 1e-3
    assert "measurements.csv:4: rel_iqr=" in caplog.text and "measured again by the next bench" in caplog.text
    assert [r.line for r in profile.rejected()] == [4]


def test_an_unreadable_file_is_an_error_naming_it(csv_file):
    csv_file.write_bytes(b"key,round,family,median_s\n\xff\xfe,0,gemm,1\n")
    with pytest.raises(ProfileError, match=r"measurements.csv is not UTF-8 text"):
        DeviceProfile.load(csv_file.parent).measurements()


@pytest.mark.parametrize("file", COMMITTED, ids=lambda f: f.parent.name)
def test_committed_profiles_load_whole_and_unchanged(file):
    before = hashlib.sha256(file.read_bytes()).hexdigest()
    frame, rejected = read_rows(file)
    assert rejected == [] and len(frame) == file.read_text().count("\n") - 1
    assert hashlib.sha256(file.read_bytes()).hexdigest() == before


def test_spmm_rows_from_before_the_column_fields_load_beside_new_ones(tmp_path):
    """A row measured before SpmmSpec had src_cv/src_read_share (no such columns) keeps its key
    and means uniform columns; a row with them is a different kernel; both load."""
    from costmodel.families.spmm import SpmmSpec

    def row(spec):
        return {**_row(1), "key": spec.key(), **spec.to_record(), "flops": spec.flops(), "bytes_moved": spec.bytes_moved()}

    old, new = SpmmSpec(1000, 16, 500, 500, 0.5), SpmmSpec(1000, 16, 500, 500, 0.5, "float32", 3.0, 0.3)
    profile = DeviceProfile.open(tmp_path, fingerprint(torch.device("cpu"), "float32"))
    profile.append_measurements([{k: v for k, v in row(old).items() if k not in ("src_cv", "src_read_share")}])
    profile.append_measurements([row(new)])
    frame, rejected = read_rows(profile.path / "measurements.csv")
    assert rejected == [] and len(frame) == 2
    specs = profile.specs()
    assert set(specs) == {old, new} and old.key() == "dtype=float32|family=spmm|index_cv=0.5|nnz=1000|num_dst=500|num_src=500|width=16"
