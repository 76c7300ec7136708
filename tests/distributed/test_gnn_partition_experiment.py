"""experiment=gnn_partition end to end in its tiny form (two real gloo processes), its
predict-only what-if at a larger W, and its bad-input errors (before anything is measured)."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[2] / "conf")
TINY = ["+tiny=gnn_partition", "timing.min_run_time_s=0.006", "timing.min_runs=3", "timing.rounds=1",
        "timing.retries=0", "timing.layer_min_calls=3", "progress=false", "measure_lock.mode=off"]
SUMMARY_KEYS = {"experiment", "device", "n_points", "noise_cv_pct", "median_ape_pct", "p90_ape_pct", "max_ape_pct",
                "spearman", "details"}


def _cfg(profile_root: Path, *extra: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=["experiment=gnn_partition", f"profile.root={profile_root}", *TINY, *extra])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from experiments import gnn_partition

    root = tmp_path_factory.mktemp("profiles")
    out = root / "out"
    summary = gnn_partition.run(_cfg(root), out_dir=out)
    return {"root": root, "out": out, "summary": summary}


def test_tiny_run_writes_the_common_schema_held_out(tiny_run):
    out, summary = tiny_run["out"], tiny_run["summary"]
    written = json.loads((out / "summary.json").read_text())
    assert set(written) == SUMMARY_KEYS and written["experiment"] == "gnn_partition"
    assert written["n_points"] == summary["n_points"] == 2 * 2  # sweep points x partitioners (one backend)
    assert set(written["median_ape_pct"]) == {"L0", "L1", "L2", "L3"}
    details = written["details"]
    assert details["scoring"] == "held-out" and details["heldout"]["scored"] and details["heldout"]["excluded_kernels"] > 0
    assert set(details["profile_lookup"]["median_ape_pct"]) == {"L0", "L1", "L2", "L3"}
    assert details["threads_per_rank"] == 1 and details["world_size"] == 2
    colo = details["colocation"]  # measured in the run (the default), then applied to every rank's kernels
    assert colo["mode"] == "measure" and colo["applied"] and colo["factors"]
    assert {"median_ape_L3_pct", "median_ape_L3_pct_alone", "median_pred_over_measured_L3_alone"} <= set(colo)
    assert multiprocessing.active_children() == []


def test_tiny_run_details_partition(tiny_run):
    part = json.loads((tiny_run["out"] / "summary.json").read_text())["details"]["partition"]
    assert len(part["points"]) == 4
    for p in part["points"]:
        assert p["partitioner"] in ("random", "metis")
        assert len(p["measured"]["ranks"]) == len(p["predicted"]["L3"]["ranks"]) == 2
        assert set(p["measured"]["ranks"][0]["phases"]) == {"send", "halo", "layer"}
        assert set(p["predicted"]["L3"]["ranks"][0]["phases"]) == {"send", "wait", "halo", "layer"}
        assert p["measured"]["step_s"] > 0 and p["predicted"]["L3"]["step_s"] > 0
        assert sum(p["plan"]["rank_edges"]) == 2048
    gains = part["metis_gain_over_random"]
    assert len(gains) == 2 and {"measured_gain", "predicted_gain_L3", "predicted_gain_L2"} <= set(gains[0])
    assert part["straggler"]["points"] == 4


def test_tiny_run_results_and_plots(tiny_run):
    out = tiny_run["out"]
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4 and set(df["partitioner"]) == {"random", "metis"}
    for col in ("measured_s", "measured_iqr_s", "pred_L0_s", "pred_L2_s", "pred_L3_s", "ape_L3_pct", "pred_lookup_L3_s",
                "straggler_pred", "straggler_measured", "measured_rank1_layer_s", "pred_rank1_layer_L3_s",
                "edge_cut_share", "plan_skew_share"):
        assert col in df.columns, col
    assert (df["measured_s"] > 0).all()
    assert (out / "partition_timelines.png").stat().st_size > 0 and (out / "predicted_vs_measured.png").stat().st_size > 0


def test_predict_only_what_if_at_a_larger_world_size_says_it_extrapolates(tiny_run, tmp_path, monkeypatch):
    from experiments import gnn_partition
    import sim.distributed.gnn_partition_layer as layer_module

    def no_launch(*args, **kwargs):
        raise AssertionError("measure=false must launch no rank")

    monkeypatch.setattr(layer_module, "run_partition_forward", no_launch)
    out = tmp_path / "whatif"
    summary = gnn_partition.run(_cfg(tiny_run["root"], "measure=false"), out_dir=out)
    written = json.loads((out / "summary.json").read_text())
    assert set(written) == SUMMARY_KEYS and written["details"]["measured"] is False
    assert written["median_ape_pct"]["L3"] is None
    assert written["details"]["world_size"] == 4  # the tiny whatif_world_size
    assert "extrapolates" in written["details"]["extrapolates"] and "W=4" in written["details"]["extrapolates"]
    assert summary["n_points"] == 4
    assert all(len(p["predicted"]["L3"]["ranks"]) == 4 for p in written["details"]["partition"]["points"])
    assert (out / "partition_timelines.png").exists()
    colo = written["details"]["colocation"]  # the default, measure, measures nothing here: the factors the tiny run measured
    assert colo["mode"] == "measure" and colo["applied"] and "the factors last measured" in colo["how"]


def test_a_stated_link_carries_the_halo_exchange_of_the_what_if(tiny_run, tmp_path):
    from experiments import gnn_partition

    steps = {}
    for latency_us in (0, 1e6):  # one halo all-to-all a step: a one-second latency adds one second
        out = tmp_path / f"link{latency_us:g}"
        gnn_partition.run(_cfg(tiny_run["root"], "measure=false", f"partition.link.latency_us={latency_us}",
                               "partition.link.bandwidth_gb_per_s=100"), out_dir=out)
        written = json.loads((out / "summary.json").read_text())
        assert "a stated link (partition.link, not measured)" in written["details"]["extrapolates"]
        steps[latency_us] = pd.read_csv(out / "results.csv")["pred_L3_s"]
    assert ((steps[1e6] - steps[0] - 1.0).abs() < 1e-3).all(), (steps[1e6] - steps[0]).tolist()


@pytest.mark.parametrize("overrides, message", [
    (["partition.partitioners=[random,spectral]"], "partition.partitioners[1] must be one of ['random', 'metis'], "
                                                   "got 'spectral'"),
    (["partition.world_size=64"], "partition.world_size must be an integer in [2, "),
    (["partition.world_size=1"], "partition.world_size must be an integer in [2, "),
    (["gnn.num_nodes=1", "gnn.num_edges=4"], "partition.world_size must be an integer in [2, 1]"),
    (["gnn.in_features=0"], "gnn.in_features must be a positive integer (>= 1), got 0"),
    (["gnn.out_features=-2"], "gnn.out_features must be a positive integer (>= 1), got -2"),
    (["partition.repeats=2"], "partition.repeats must be an integer in [3, 200], got 2"),
    (["partition.keep_awake=2"], "partition.keep_awake must be one of [True, False], got 2"),
    (["partition.collective_suite=huge"], "partition.collective_suite must be one of ['full', 'quick'], got 'huge'"),
    (["partition.colocation=sometimes"], "partition.colocation must be one of ['measure', 'profile', 'off'], "
                                         "got 'sometimes'"),
    (["measure=false", "partition.whatif_world_size=1000"],
     "partition.whatif_world_size must be an integer in [2, 512], got 1000"),
    (["partition.link.latency_us=5", "partition.link.bandwidth_gb_per_s=100"],
     "partition.link states a link for measure=false what-ifs; a measured run times its own collectives"),
    (["measure=false", "partition.link.bandwidth_gb_per_s=100"],
     "partition.link needs both latency_us and bandwidth_gb_per_s, got latency_us=None, bandwidth_gb_per_s=100"),
])
def test_bad_input_names_the_field_and_range_before_measuring(tmp_path, overrides, message):
    from experiments import gnn_partition

    with pytest.raises(ValueError, match=re.escape(message)):
        gnn_partition.validate(_cfg(tmp_path, *overrides))
    assert not any(tmp_path.iterdir())  # nothing measured, no profile created
