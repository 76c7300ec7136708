"""scripts/bench_kernel_sittings.py: the context ratio, the within- and between-sitting spreads
and now / profiled per (group, family), hand-computed; a tiny real run writes them; bad groups
and counts are refused before anything is timed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from script_loader import loaded_script

from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.store.profile import DeviceProfile

CEIL = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10, "overhead_s": 1e-6, "ridge_flops_per_byte": 10.0}


@pytest.fixture(scope="module")
def script():
    yield from loaded_script("bench_kernel_sittings")


def test_summary_separates_context_from_sittings(script):
    rows = pd.DataFrame({
        "group": ["moe:paired"] * 3, "family": ["gemm"] * 3, "profiled_s": [1.0, 2.0, 4.0],
        "bench_s_0": [1.1, 2.0, 4.4], "load_s_0": [1.1 * 1.02, 2.0 / 1.02, 4.4 * 1.05],
        "bench_s_1": [1.1 * 1.2, 2.0 * 1.1, 4.4 * 1.1],
    })
    s = script.summarise(rows, sittings=2).iloc[0]
    assert s["kernels"] == 3
    assert s["after_load_over_bench"] == pytest.approx(1.02)  # median of 1.02, 1/1.02, 1.05
    assert s["within_sitting_dev_pct"] == pytest.approx(100 * np.log(1.02))
    assert s["now_over_profiled"] == pytest.approx(1.1)  # median of 1.1, 1.0, 1.1
    assert s["last_over_first_sitting"] == pytest.approx(1.1)
    # after the group's 1.1x shift: 1.2/1.1, 1, 1 -> the median kernel is not off at all
    assert s["between_sittings_dev_pct"] == pytest.approx(0.0, abs=1e-9)


@pytest.fixture
def profile(tmp_path) -> DeviceProfile:
    p = DeviceProfile.open(tmp_path / "profiles", fingerprint(torch.device("cpu"), "float32"))
    rows = []
    for spec, tag in ((GemmSpec(4, 32, 32), "paired"), (GemmSpec(8, 32, 32), "heldout_neighbour")):
        rows.append({"key": spec.key(), "round": 0, **spec.to_record(), "flops": spec.flops(),
                     "bytes_moved": spec.bytes_moved(), "median_s": 2e-6, "iqr_s": 1e-8, "noisy": False,
                     "suite": "moe", "tag": tag})
    p.append_measurements(rows)
    p.write_ceilings(CEIL)
    return p


def test_a_tiny_run_times_each_group_in_two_sittings(script, profile, tmp_path):
    out = tmp_path / "out"
    assert script.main([str(profile.path), "--sittings", "2", "--gap-s", "0", "--rounds", "1", "--load-s", "0",
                        "--threads", "1", "--out", str(out)]) == 0
    kernels = pd.read_csv(out / "kernels.csv")
    assert sorted(kernels["group"]) == ["moe:heldout_neighbour", "moe:paired"]
    for col in ("bench_s_0", "load_s_0", "bench_s_1", "load_s_1"):
        assert (kernels[col] > 0).all(), col
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sittings"] == 2 and {g["group"] for g in summary["per_group"]} == set(kernels["group"])
    assert all("between_sittings_dev_pct" in g for g in summary["per_group"])


@pytest.mark.parametrize("argv, message", [
    (["--groups", "hf_moe:paired"], "--groups: ['hf_moe:paired'] not in"),
    (["--groups", "moe"], "a group is SUITE:TAG"),
    (["--rounds", "0"], "--rounds must be an integer >= 1, got 0"),
    (["--load-s", "-1"], "--load-s must be a finite number >= 0, got -1.0"),
    (["--families", "scatter"], "no kernel of"),
])
def test_bad_input_is_refused_before_timing(script, profile, capsys, argv, message):
    with pytest.raises(SystemExit) as err:
        script.main([str(profile.path), *argv])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
