"""The Python API refuses bad input with the field, the offending value and the range."""

from __future__ import annotations

from tiny_budget import tiny_timing_section
import numpy as np
import pandas as pd
import pytest
import torch

from sim.api import load_cost_model, predict_moe_latency
from sim.workloads.moe_layer import DispatchPlan, MoEConfig
from sim.workloads.routing import UniformRouting, route

CFG = MoEConfig(backend="padded")  # 1024 tokens, top_k 2, 16 experts: at most 2048 assignments


@pytest.mark.parametrize(
    "counts, message",
    [
        ([1024] * 16, r"counts must sum to between 1 and moe.tokens x moe.top_k = 1024 x 2 = 2048 .*got 16384"),
        ([0] * 16, r"counts must sum to between 1 and .* = 2048 .*got 0"),
        ([-1] + [137] * 15, r"counts\[0\] must be an integer in \[0, moe.tokens=1024\], got -1"),
        ([64] * 15 + ["a"], r"counts\[15\] must be an integer in \[0, moe.tokens=1024\], got 'a'"),
        ([64, float("nan")] + [64] * 14, r"counts\[1\] must be an integer in \[0, moe.tokens=1024\], got nan"),
        ([128.7] + [128] * 15, r"counts\[0\] must be an integer in \[0, moe.tokens=1024\], got 128.7"),
        ([1025] + [0] * 15, r"counts\[0\] must be an integer in \[0, moe.tokens=1024\], got 1025"),
        ([True] + [128] * 15, r"counts\[0\] must be an integer"),
        ([128] * 15, r"counts must hold moe.num_experts=16 token counts \(one per expert\), got 15"),
        ("128", r"counts must be a sequence of moe.num_experts=16 integers, got str"),
    ],
)
def test_bad_counts_name_the_index_and_the_range(counts, message):
    with pytest.raises(ValueError, match=message):
        predict_moe_latency(CFG, None, counts=counts)  # refused before the model is touched


def test_whole_counts_of_any_numeric_type_give_the_same_plan():
    expected = DispatchPlan.from_expert_counts([128] * 16, CFG)
    assert expected.assignments == 2048 and expected.padded_rows == 16 * 128
    for counts in (np.full(16, 128), torch.full((16,), 128), [128.0] * 16, [np.int32(128)] * 16):
        assert DispatchPlan.from_expert_counts(counts, CFG) == expected


def test_counts_below_tokens_times_top_k_stand_for_capacity_drops():
    plan = DispatchPlan.from_expert_counts([1024] + [0] * 15, CFG)
    assert plan.assignments == 1024 and plan.counts[0] == 1024


def test_routing_for_another_layer_shape_is_refused():
    routing = route(UniformRouting(), tokens=8, num_experts=16, top_k=2, seed=0)
    with pytest.raises(ValueError, match=r"routing is for tokens=8.*the layer has moe.tokens=1024"):
        predict_moe_latency(CFG, None, routing=routing)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(threads=0), r"threads must be a positive integer \(>= 1\) or null"),
        (dict(threads=2.5), r"threads must be a positive integer"),
        (dict(dtype="float8"), r"dtype must be one of \['float64', 'float32', 'bfloat16', 'float16'\], got 'float8'"),
        (dict(dtype="float8", threads=1), r"dtype must be one of"),
        (dict(allocator="jemalloc"), r"allocator must be one of \['steady', 'system'\]"),
        (dict(refresh="sometimes"), r"^refresh must be one of \['never', 'auto', 'always'\]"),
        (dict(refresh="auto", tolerance=0), r"^tolerance must be a number in \(0, 10\)"),
        (dict(refresh="auto", kernels=["gemm"]), r"kernels must be kernel descriptors"),
        (dict(cold_cache="no"), r"^cold_cache must be True or False, got 'no'"),
        (dict(cold_cache=0), r"^cold_cache must be True or False, got 0"),
    ],
)
def test_load_cost_model_checks_every_argument_before_setting_anything(kwargs, message, tmp_path):
    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match=message):
        load_cost_model(profile_root=tmp_path, **kwargs)
    assert torch.get_num_threads() == threads  # nothing was set by a refused call
    assert not list(tmp_path.iterdir())


def test_load_cost_model_refreshes_a_stale_profile_on_request(tmp_path, busy_guard_aside):
    """refresh="auto": a profile made 3x slow is caught per family, the given kernels are
    re-measured and the models refitted; refresh="never" (the default) measures nothing."""
    from costmodel.families.gemm import GemmSpec
    from costmodel.families.sort import SortSpec
    from costmodel.measure.runtime import Runtime
    from sim.predict.calibration import calibrated_model

    # GEMMs large enough that the 3x-slowed rows stay inside pick_references' 5 us .. 50 ms window on
    # any machine (32x32 GEMMs of 1-4 rows ran under 2 us on the Intel VM: no reference, no refresh)
    suite = [("grid", GemmSpec(m, 128, 128)) for m in (8, 16, 32, 64, 128, 256)] + [("grid", SortSpec(n)) for n in (512, 1024, 2048, 4096)]
    rt = Runtime.from_cfg({"device": "cpu", "dtype": "float32", "threads": None, "allocator": "steady", "seed": 0,
                           "profile": {"root": str(tmp_path)},
                           "timing": tiny_timing_section(max_rel_iqr=0.5),
                           "limits": {"cpu": {"max_flops": 1e9, "max_bytes": 1e9}}})
    calibrated_model(rt, suite, suite_name="t", progress=False, refresh="never")
    profile = rt.open_profile()
    file = profile.path / "measurements.csv"
    frame = pd.read_csv(file)
    for col in ("median_s", "iqr_s", "mean_s", "min_s", "std_s"):  # every statistic, or the rows fail validation
        if col in frame:
            frame[col] *= 3.0
    frame.to_csv(file, index=False)
    never = load_cost_model(device="cpu", profile_root=tmp_path)  # measures nothing: refits on the changed profile
    assert never.origin == "fitted" and never.profile_hash == profile.content_hash() and not never.freshness
    kernels = [s for _, s in suite[2:5]]
    model = load_cost_model(device="cpu", profile_root=tmp_path, refresh="auto", tolerance=0.5, kernels=kernels)
    fresh = model.freshness
    assert fresh["refreshed"] and "gemm" in fresh["stale_families"] and fresh["family_ratio"]["gemm"] < 0.67
    assert fresh["refreshed_kernels"] == 3  # the kernels asked for, not the whole profile
    assert model.profile_hash == profile.content_hash()
