"""experiment=moe_ep: bad input fails before anything is measured; the tiny form runs two real
gloo processes end to end (collectives: the collective profile when there is one, else a
latency-bandwidth fit to a grid of all-to-alls timed in the same launch, saved beside the
device profile) and writes the common summary with every point's two rank timelines;
measure=false then predicts a larger W from that fit and says it extrapolates."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[2] / "conf")
SUMMARY_KEYS = {"experiment", "device", "n_points", "noise_cv_pct", "median_ape_pct", "p90_ape_pct", "max_ape_pct",
                "spearman", "details"}


def _cfg(profile_root: Path, *extra: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=["experiment=moe_ep", "+tiny=moe_ep", f"profile.root={profile_root}",
                                            "+timing_budget=tiny", "progress=false", *extra])


@pytest.mark.parametrize("overrides, message", [
    (["ep.world_size=5"], "ep.world_size must be an integer in [2, 4], got 5"),  # more ranks than experts
    (["ep.world_size=1"], "ep.world_size must be an integer in [2, 4], got 1"),
    (["ep.placements=[contiguous,random]"],
     "ep.placements[1] must be one of ['contiguous', 'round_robin', 'load_aware'] (or {slots: [[...], ...]}), got 'random'"),
    (["ep.placements=[{slots:[[0,1],[2]]}]"],
     "ep.placements[0]: placement.slot_expert must hold every expert in [0, moe.num_experts=4) at least once, missing [3]"),
    (["ep.repeats=2"], "ep.repeats must be an integer in [3, 200], got 2"),
    (["ep.whatif_world_size=9"], "ep.whatif_world_size must be an integer in [2, 4], got 9"),
    (["ep.keep_awake=sometimes"], "ep.keep_awake must be one of [True, False], got 'sometimes'"),
    (["ep.link.latency_us=5", "ep.link.bandwidth_gb_per_s=100"],
     "ep.link states a link for measure=false what-ifs; a measured run times its own collectives: set measure=false "
     "or drop ep.link"),
    (["measure=false", "ep.link.latency_us=5"],
     "ep.link needs both latency_us and bandwidth_gb_per_s, got latency_us=5, bandwidth_gb_per_s=None"),
    (["measure=false", "ep.link.latency_us=5", "ep.link.bandwidth_gb_per_s=0"],
     "ep.link.bandwidth_gb_per_s must be a number of GB/s > 0 or null, got 0"),
    (["measure=false", "ep.link.latency_us=-1", "ep.link.bandwidth_gb_per_s=10"],
     "ep.link.latency_us must be a number of microseconds >= 0 or null, got -1"),
])
def test_bad_input_names_the_field_and_range_before_measuring(tmp_path, overrides, message):
    module = importlib.import_module("experiments.moe_ep")
    cfg = _cfg(tmp_path, *overrides)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        module.validate(cfg)
    assert not (tmp_path / "profiles").exists() and not any(tmp_path.iterdir())  # nothing measured or written


def test_more_ranks_than_the_machine_can_pin_is_refused(tmp_path, monkeypatch):
    module = importlib.import_module("experiments.moe_ep")
    monkeypatch.setattr(module, "usable_cores", lambda: 2)
    with pytest.raises(ValueError, match=re.escape("ep.world_size=4 cannot be placed here: one pinned core per rank and "
                                                   "this process may use 2 cores; allowed [2, 2]")):
        module.validate(_cfg(tmp_path, "ep.world_size=4"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe_ep")
    out = root / "out"
    with pytest.MonkeyPatch.context() as mp:  # a fresh tiny profile's kernels all run under the references' range
        mp.setattr("sim.predict.heldout_drift.REFERENCE_TIME_RANGE_S", (0.0, 1.0))
        summary = importlib.import_module("experiments.moe_ep").run(_cfg(root / "profiles"), out_dir=out)
    return root, out, summary


def test_tiny_run_writes_the_common_schema_and_two_timelines_per_point(tiny_run):
    _, out, summary = tiny_run
    written = json.loads((out / "summary.json").read_text())
    assert set(written) == SUMMARY_KEYS and written["experiment"] == "moe_ep"
    assert written["n_points"] == 2 * 3  # routings x placements (one backend)
    details = written["details"]
    assert details["scoring"] == "held-out" and details["heldout"]["scored"]
    assert set(details["profile_lookup"]["median_ape_pct"]) == {"L0", "L1", "L2", "L3"}
    replay = details["replay"]  # rank replay: each rank's kernels timed inside the ranks
    assert replay["median_ape_pct"]["L3"] >= 0 and "composition check" in replay["what"]
    assert set(replay["kernels_in_rank_over_profile"]) == {"rank0", "rank1"}
    table = pd.read_csv(out / "results.csv")
    assert (table["pred_replay_L3_s"] > 0).all() and (table["pred_replay_L3_s"] != table["pred_L3_s"]).any()
    points = details["ep"]["points"]
    assert len(points) == 6 and {p["placement"] for p in points} == {"contiguous", "round_robin", "load_aware"}
    for p in points:
        assert len(p["measured"]["ranks"]) == 2
        for lv in ("L0", "L2", "L3"):
            assert len(p["predicted"][lv]["ranks"]) == 2
            assert p["predicted"][lv]["straggler"] in (0, 1)
            for rank in p["predicted"][lv]["ranks"]:
                assert list(rank) == ["router", "dispatch", "experts", "combine", "weighted_sum"]
                assert rank["weighted_sum"]["end_s"] <= p["predicted"][lv]["step_s"] + 1e-15
        assert p["measured"]["step_s"] > 0
    assert {g["value"] for g in details["ep"]["placement_gains"]} == {0.0, 3.0}
    # two rounds over the cases (conf/tiny/moe_ep.yaml): each round's median, and each gain's noise from them
    assert table[["measured_round0_s", "measured_round1_s"]].gt(0).all().all() and "measured_round2_s" not in table
    assert all(len(g["measured_gain_rounds"]) == 2 and g["measured_gain_se"] >= 0 for g in details["ep"]["placement_gains"])
    assert details["ep"]["placement_gain_summary"]["points"] == 2
    assert details["ep"]["straggler"]["clear_points"] <= 6
    phases = details["ep"]["phase_over_measured"]
    for scoring in ("heldout", "replay"):  # router, dispatch prep, experts and weighted sum timed on both ranks
        assert set(phases[scoring]) == {"router", "dispatch", "experts", "weighted_sum"}
        assert all(0 < r["p10"] <= r["median"] <= r["p90"] and r["rank_points"] <= 12 for r in phases[scoring].values())
    # the drift side score: references (never this run's kernels) timed inside the ranks
    drift = details["heldout"]["drift"]
    assert drift["references"] == len(drift["reference_kernels"]) > 0
    assert details["heldout_drift_scaled"]["median_ape_pct"]["L3"] >= 0
    assert (table["pred_heldout_drift_L3_s"] > 0).all()
    assert (out / "results.csv").stat().st_size > 0
    assert (out / "ep_timelines.png").exists() and (out / "predicted_vs_measured.png").exists()


def test_predict_only_extrapolates_to_a_larger_world_size(tiny_run, tmp_path):
    root, _, _ = tiny_run
    out = tmp_path / "whatif"
    summary = importlib.import_module("experiments.moe_ep").run(_cfg(root / "profiles", "measure=false"), out_dir=out)
    written = json.loads((out / "summary.json").read_text())
    assert written["details"]["measured"] is False and written["details"]["world_size"] == 4
    assert "extrapolates" in written["details"]["extrapolates"]
    assert all(len(p["predicted"]["L3"]["ranks"]) == 4 for p in written["details"]["ep"]["points"])
    assert summary["n_points"] == 6 and (out / "ep_timelines.png").exists()


def test_a_stated_link_replaces_the_collective_profile_in_the_what_if(tiny_run, tmp_path):
    root, _, _ = tiny_run
    module = importlib.import_module("experiments.moe_ep")
    steps = {}
    for latency_us in (0, 1e6):  # a one-second latency per all-to-all: the counts, the rows and the combine pay it
        out = tmp_path / f"link{latency_us:g}"
        module.run(_cfg(root / "profiles", "measure=false", f"ep.link.latency_us={latency_us}",
                        "ep.link.bandwidth_gb_per_s=100"), out_dir=out)
        written = json.loads((out / "summary.json").read_text())
        assert "a stated link (ep.link, not measured): alpha" in written["details"]["extrapolates"]
        assert written["details"]["collective_backend"] == "gloo"  # the predicted device's (a CPU profile here)
        steps[latency_us] = pd.read_csv(out / "results.csv")["pred_L3_s"]
    assert ((steps[1e6] - steps[0] - 3.0).abs() < 1e-3).all(), (steps[1e6] - steps[0]).tolist()


def test_a_gpu_profile_needs_a_stated_link_and_says_so_before_planning(tiny_run, tmp_path, monkeypatch):
    root, _, _ = tiny_run
    module = importlib.import_module("experiments.moe_ep")
    monkeypatch.setattr(module, "collective_backend", lambda fingerprint: "nccl")  # as for a cuda-* profile
    monkeypatch.setattr(module, "_plan_points", lambda *a, **k: pytest.fail("planned before the collectives check"))
    with pytest.raises(ValueError, match=re.escape("needs a nccl all-to-all model for W=4, and this host's gloo "
                                                   "collectives say nothing about it")) as err:
        module.run(_cfg(root / "profiles", "measure=false"), out_dir=tmp_path / "out")
    assert "ep.link.latency_us=... ep.link.bandwidth_gb_per_s=..." in str(err.value)


def test_phase_ratios_compare_each_local_phase_and_skip_the_ones_not_run():
    from experiments.moe_ep import phase_ratios
    from sim.distributed.ep_predict import RankTimeline

    def timeline(router_s, experts_s):
        compute = {"router": router_s, "dispatch": 1e-4, "experts": experts_s, "combine": 0.0, "weighted_sum": 1e-4}
        zero = dict.fromkeys(compute, 0.0)
        return RankTimeline(dict.fromkeys(compute, (0.0, 0.0)), compute, zero, zero)

    def measured(router_s, experts_s):
        return {"router": router_s, "dispatch_prep": 2e-4, "dispatch_a2a": 5e-3, "experts": experts_s,
                "combine": 7e-3, "weighted_sum": 0.0}

    ratios = phase_ratios([(timeline(1e-4, 8e-3), measured(1e-4, 1e-2)),  # experts 0.8x
                           (timeline(2e-4, 9e-3), measured(1e-4, 1e-2)),  # router 2x, experts 0.9x
                           (timeline(1e-4, 1e-2), measured(1e-4, 1e-2))])
    assert ratios["experts"]["median"] == pytest.approx(0.9) and ratios["experts"]["rank_points"] == 3
    assert ratios["experts"]["p10"] == pytest.approx(0.82) and ratios["experts"]["p90"] == pytest.approx(0.98)
    assert ratios["router"]["median"] == pytest.approx(1.0) and ratios["router"]["p90"] == pytest.approx(1.8)
    assert ratios["dispatch"]["median"] == pytest.approx(0.5)  # the prep only; the all-to-all holds waits
    assert "weighted_sum" not in ratios  # measured 0 s on every rank: nothing to compare


def test_rank_drift_reads_each_reference_at_its_median_over_the_ranks():
    from costmodel.families.gemm import GemmSpec
    from experiments.moe_ep import rank_drift
    from sim.predict.heldout_drift import HeldOutReference

    refs = [HeldOutReference(f"k{i}", "gemm", GemmSpec(1, 1, 1), 1.0, None, 1.0) for i in range(3)]
    drift = rank_drift(refs, [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])  # medians over the ranks 2, 3, 4
    assert drift.by_family == {"gemm": 3.0} and drift.references == 3
    assert rank_drift(refs[:0], [[], []]).references == 0
    # read net of each reference's co-location factor: beside its twin a GEMM ran 2x here
    from costmodel.colocation.store import ColocationFactors

    net = rank_drift(refs, [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]], colocation=ColocationFactors.constant({"gemm": 2.0}))
    assert net.by_family == {"gemm": 1.5}
    with pytest.raises(ValueError, match=re.escape("3 references but the ranks timed [3, 2]")):
        rank_drift(refs, [[1.0, 2.0, 3.0], [1.0, 2.0]])
