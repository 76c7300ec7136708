"""Every experiment config composes and runs end to end in a tiny form; bad input fails fast."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[2] / "conf")
EXPERIMENTS = sorted(p.stem for p in Path(CONF, "experiment").glob("*.yaml"))
SUMMARY_KEYS = {"experiment", "device", "n_points", "noise_cv_pct", "median_ape_pct", "p90_ape_pct", "max_ape_pct",
                "spearman", "details"}

TINY_TIMING = ["+timing_budget=tiny", "progress=false"]  # conf/timing_budget/tiny.yaml
#: each experiment's tiny form: the config group conf/tiny/NAME.yaml, selected with +tiny=NAME
#: (scripts/gpu_check.sh's CPU dry run selects the same files)
TINY = {p.stem: [f"+tiny={p.stem}"] for p in sorted(Path(CONF, "tiny").glob("*.yaml"))}


def _cfg(name: str, profile_root: Path, *extra: str):
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("config", overrides=[f"experiment={name}", f"profile.root={profile_root}", *TINY_TIMING,
                                            *TINY[name], *extra])


def test_every_experiment_has_a_tiny_form():
    assert set(EXPERIMENTS) == set(TINY)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_config_composes(name, tmp_path):
    cfg = _cfg(name, tmp_path)
    assert cfg.name == name
    assert importlib.import_module(f"experiments.{name}").run


@pytest.fixture(scope="module")
def shared_profile(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


@pytest.mark.parametrize("name", [n for n in EXPERIMENTS if n != "roofline"] + ["roofline"])
def test_tiny_experiment_writes_every_output(name, shared_profile, tmp_path, monkeypatch):
    if name == "placement" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the placement experiment pins its two devices to cores 0 and 1")
    monkeypatch.chdir(shared_profile)  # roofline globs outputs/ of the earlier tiny runs here
    out = shared_profile / "outputs" / name / "run"
    summary = importlib.import_module(f"experiments.{name}").run(_cfg(name, shared_profile), out_dir=out)
    assert set(summary) == SUMMARY_KEYS and summary["experiment"] == name
    written = json.loads((out / "summary.json").read_text())
    assert written["n_points"] == summary["n_points"] > 0
    assert set(written["details"]["run"]) == {"commit", "dirty", "finished_at"}  # which code, when
    assert set(written["median_ape_pct"]) == {"L0", "L1", "L2", "L3"}
    assert (out / "results.csv").stat().st_size > 0
    assert list(out.glob("*.png"))
    if name == "roofline":
        assert set(summary["details"]["experiments_found"]) >= {"moe_skew", "gnn_degree", "mlp_batch"}
    if name == "placement":
        _check_placement_outputs(written, out)
    if name in ("moe_skew", "gnn_degree"):  # calibration.paired (default): the layers' kernels timed beside them
        paired = written["details"]["paired"]
        assert paired["kernels"] > 0 and paired["rows"] == paired["kernels"]  # timing.rounds=1: one row each
        assert "profile_drift" not in written["details"]  # no separate references in a paired run
        assert set(written["details"]["replay"]) >= {"median_ape_pct", "p90_ape_pct", "max_ape_pct"}
    if name != "roofline":  # every measuring experiment's headline is held out (placement's too)
        details = written["details"]
        assert details["scoring"] == "held-out" and details["heldout"]["scored"]
        assert details["heldout"]["excluded_kernels"] > 0 and details["heldout"]["fitted_rows"] > 0
        assert set(details["profile_lookup"]["median_ape_pct"]) == {"L0", "L1", "L2", "L3"}
    if name == "moe_design":  # the measured sample scores the decisions
        decisions = written["details"]["decisions"]
        assert set(decisions) >= {"sampled", "separable", "agree_pct", "mean_loss_pct"}
        assert decisions["sampled"] == 3 and 0 <= decisions["separable"] <= 3
        assert written["details"]["grid_configs"] == 2 * 1 * 1 * 2 * 9 * 3  # T x D x E x k x routings x backends
        assert (out / "sample.csv").stat().st_size > 0 and list(out.glob("decisions_*.csv"))


def _check_placement_outputs(summary, out):
    """details.placement per level and the oracle; the oracle is optimal under the measured
    latencies, so no level's realised makespan beats it; one results row per workload,
    device and level; a Gantt chart per level; the real run happened."""
    import pandas as pd

    placement = summary["details"]["placement"]
    assert set(placement) == {"L0", "L2", "L3", "oracle"}
    for level, r in placement.items():
        assert {"predicted_makespan_s", "realised_makespan_s", "measured_makespan_s", "regret_pct"} <= set(r)
        assert r["measured_makespan_s"] > 0 and r["regret_pct"] >= -1e-9
        assert sorted(w for ws in r["assignment"].values() for w in ws) == sorted(
            ["mlp_balanced", "mlp_skinny", "moe", "gnn"])
        assert (out / f"gantt_{level}.png").exists()
    assert placement["oracle"]["regret_pct"] == 0 and placement["oracle"]["same_placement_as_oracle"]
    assert summary["details"]["concurrent"] is True
    assert summary["details"]["heldout"]["per_profile"]  # the levels placed by models refitted without the mix
    assert summary["n_points"] == 4 * 2  # workload x device rows behind the common schema
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 4 * 2 * 4
    assert results.groupby(["workload", "level"])["placed_here"].sum().eq(1).all()  # each placed exactly once
    placed = results[results["placed_here"]]
    assert placed["run_end_s"].gt(placed["run_start_s"]).all()


@pytest.mark.parametrize("name", ["moe_design", "moe_skew", "gnn_degree"])
def test_predict_only_measures_nothing_and_keeps_the_summary_schema(name, shared_profile, tmp_path, monkeypatch):
    import experiments.common as common
    import sim.predict.calibration

    if not (shared_profile / "outputs" / name / "run" / "summary.json").exists():  # run alone: calibrate first
        importlib.import_module(f"experiments.{name}").run(_cfg(name, shared_profile), out_dir=tmp_path / "calibrate")

    def no_timing(*args, **kwargs):
        raise AssertionError("measure=false must time nothing")

    for module in (common, importlib.import_module(f"experiments.{name}"), importlib.import_module("experiments.workloads")):
        monkeypatch.setattr(module, "measure_interleaved", no_timing, raising=False)
    monkeypatch.setattr(sim.predict.calibration, "measure_specs", no_timing)
    out = tmp_path / "out"
    summary = importlib.import_module(f"experiments.{name}").run(_cfg(name, shared_profile, "measure=false"), out_dir=out)
    written = json.loads((out / "summary.json").read_text())
    assert set(written) == SUMMARY_KEYS and written["details"]["measured"] is False
    assert written["median_ape_pct"] == {lv: None for lv in ("L0", "L1", "L2", "L3")} and written["noise_cv_pct"] is None
    results = (out / "results.csv").read_text().splitlines()
    assert written["n_points"] == summary["n_points"] == len(results) - 1 > 0
    assert "pred_L3_s" in results[0] and "measured_s" not in results[0]


def test_predict_only_needs_an_existing_profile(tmp_path):
    from costmodel.store.profile import ProfileError

    cfg = _cfg("moe_skew", tmp_path / "empty", "measure=false")
    with pytest.raises(ProfileError, match="measure=false predicts from an existing profile and measures nothing"):
        importlib.import_module("experiments.moe_skew").run(cfg, out_dir=tmp_path / "out")
    assert not (tmp_path / "empty").exists()


def test_an_experiment_that_always_measures_refuses_measure_false(tmp_path):
    import sim.__main__ as entry

    cfg = _cfg("mlp_batch", tmp_path, "measure=false")
    with pytest.raises(ValueError, match="experiment=mlp_batch always measures; measure=false"):
        entry.measures(importlib.import_module("experiments.mlp_batch"), cfg)
    assert entry.measures(importlib.import_module("experiments.moe_design"), cfg) is False
    assert entry.measures(importlib.import_module("experiments.roofline"), _cfg("roofline", tmp_path)) is False


@pytest.mark.parametrize(
    "name, overrides, message",
    [
        ("moe_skew", ["moe.top_k=9", "moe.num_experts=4"], r"moe.top_k must be in \[1, moe.num_experts=4\], got 9"),
        ("moe_skew", ["moe.tokens=-8"], "moe.tokens must be a positive integer"),
        ("moe_skew", ["moe.backends=[loop,megablocks]"], "moe.backend must be one of"),
        ("moe_skew", ["routing.sweep.values=[0.0,-2.0]"], r"routing.sweep: exponent=-2.0: routing.exponent must be in"),
        ("moe_skew", ["routing=dirichlet", "routing.sweep.values=[0.0]"], "routing.concentration must be in"),
        ("gnn_degree", ["gnn.backends=[index_add,dgl]"], "gnn.backend must be one of"),
        ("gnn_degree", ["gnn.aggregation=max", "gnn.backends=[sparse_csr]"], "'sparse_csr' aggregates by matmul"),
        ("gnn_degree", ["gnn.num_edges=0"], "gnn.num_edges must be a positive integer"),
        ("mlp_batch", ["mlp.batches=[1,0]"], r"mlp.batches must be a non-empty list of batch sizes \(integers >= 1\).*got \[1, 0\]"),
        ("moe_skew", ["device=tpu"], "device must be one of"),
        ("placement", ["placement.variant=quad"], r"placement.variant must be one of \['heterogeneous', 'homogeneous'\]"),
        ("placement", ["placement.levels=[L0,L7]"], "placement.levels must list levels from"),
        ("placement", ["placement.repeats=0"], "placement.repeats must be a positive integer"),
        ("placement", ["placement.device_sets.homogeneous.1.cores=[4096]"], r"device 'core1': cores \[4096\] are not available"),
        ("placement", ["placement.device_sets.homogeneous.0.memory_bytes=1024",
                       "placement.device_sets.homogeneous.1.memory_bytes=2048"], r"workload 'mlp_balanced' needs .* more than any"),
        ("placement", ["placement_mix.gnn.rmat_a=0.1"], r"placement_mix.gnn: rmat_a must be in"),
        ("placement", ["placement.solver=cplex"], r"placement.solver must be one of \['auto', 'milp', 'lpt'\]"),
        ("moe_skew", ["profile.id=some-device"], r"profile.id must be null with measure=true \(another device's profile predicts "
                                                  r"only: set measure=false.*got 'some-device'"),
        ("moe_design", ["design.top_k=[]"], r"design.top_k must be a non-empty list of positive integers"),
        ("moe_design", ["design.tokens=[16,0]"], r"design.tokens must be a non-empty list of positive integers"),
        ("moe_design", ["design.backends=[loop,megablocks]"], r"design.backends must list distinct backends among"),
        ("moe_design", ["design.regions=[[tokens,colour]]"], r"design.regions entries must be pairs of"),
        ("moe_design", ["sample.points=0"], r"sample.points must be a positive integer"),
        ("moe_design", ["sample.noise_pct=150"], r"sample.noise_pct must be in \[0, 100\)"),
        ("moe_design", ["sample.passes=0"], r"sample.passes must be an integer in \[1, 5\], got 0"),
        ("moe_design", ["design.routings.0.sweep.values=[-1.0]"], r"design.routings\[0\].sweep: exponent=-1.0"),
        ("moe_design", ["measure=maybe"], "measure must be true or false"),
        ("hf_moe", ["hf_moe.top_k=9", "hf_moe.num_experts=4"], r"hf_moe.top_k must be in \[1, hf_moe.num_experts=4\]"),
        ("hf_moe", ["hf_moe.implementations=[eager,megablocks]"], "hf_moe.implementations must be a non-empty list of some of"),
        ("hf_moe", ["routing.capacity_factor=1.0"], "routing.capacity_factor must be null"),
        ("pyg_conv", ["pyg.convs=[gcn,gat]"], "pyg.convs must be a list of some of"),
        ("pyg_conv", ["pyg.num_edges=0"], "pyg.num_edges must be a positive integer"),
    ],
)
def test_bad_input_fails_before_any_measuring(name, overrides, message, tmp_path):
    cfg = _cfg(name, tmp_path / "profiles", *overrides)
    with pytest.raises(ValueError, match=message):
        importlib.import_module(f"experiments.{name}").run(cfg, out_dir=tmp_path / "out")
    assert not (tmp_path / "profiles").exists()  # nothing was calibrated or measured


@pytest.mark.parametrize("ratio, warned", [(1.0, False), (1.4, False), (1.5004, False), (1.93, True), (0.5, True)])
def test_summary_warns_when_the_machine_drifted_from_its_profile(ratio, warned):
    from experiments import common

    summ = {"experiment": "x", "device": "cpu", "n_points": 1, "noise_cv_pct": 1.0,
            "median_ape_pct": {}, "p90_ape_pct": {}, "max_ape_pct": {}, "spearman": {},
            "details": {"profile_drift": {"now_over_profile_median": ratio, "now_over_profile_iqr": 0.1,
                                          "kernels": 12}}}
    with common.console.capture() as captured:
        common.print_summary(summ)
    assert ("not in the state it was profiled in" in captured.get()) == warned


def test_summary_reports_errors_with_predictions_scaled_by_the_drift():
    import pandas as pd

    from experiments import common

    df = pd.DataFrame({"pred_L3_s": [1.0, 2.0], "measured_s": [1.2, 2.6], "round_cv": [0.0, 0.0]})
    df = common.add_errors(df, levels=["L3"])
    summ = common.summary("x", "cpu", df, levels=["L3"], details={
        "profile_drift": {"now_over_profile_median": 1.25, "now_over_profile_iqr": 0.0, "kernels": 2}})
    assert summ["median_ape_pct"]["L3"] == pytest.approx((100 * 0.2 / 1.2 + 100 * 0.6 / 2.6) / 2)  # unscaled
    scaled = summ["details"]["drift_scaled_ape_pct"]
    assert scaled["factor"] == 1.25
    assert scaled["max"]["L3"] == pytest.approx(100 * 0.05 / 1.2)  # 1.25 vs 1.2 (2.5 vs 2.6 is 3.8%)
    assert scaled["median"]["L3"] == pytest.approx((100 * 0.05 / 1.2 + 100 * 0.1 / 2.6) / 2)


@pytest.mark.slow
def test_tiny_heterogeneous_placement_runs_each_device_alone(tmp_path):
    """A 2-thread device on cores 0-1 beside a 1-thread device on core 1: two fingerprints,
    two profiles, and shares run one after the other (their cores overlap)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs cores 0 and 1")
    out = tmp_path / "out"
    summary = importlib.import_module("experiments.placement").run(
        _cfg("placement", tmp_path / "profiles", "placement.variant=heterogeneous"), out_dir=out)
    details = summary["details"]
    assert details["concurrent"] is False and "alone" in details["run_note"]
    assert [d["threads"] for d in details["devices"]] == [2, 1]
    assert len({d["profile"] for d in details["devices"]}) == 2
    assert len(list((tmp_path / "profiles").iterdir())) == 2
    _check_placement_outputs({**summary, "details": {**details, "concurrent": True}}, out)


@pytest.mark.parametrize("name, module, extra", [("hf_moe", "transformers", "hf"), ("pyg_conv", "torch_geometric", "pyg")])
def test_missing_optional_library_says_what_to_install(name, module, extra, tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, module, None)  # import of it now fails
    cfg = _cfg(name, tmp_path / "profiles")
    with pytest.raises(ImportError, match=rf"pip install -e '\.\[{extra}\]'"):
        importlib.import_module(f"experiments.{name}").run(cfg, out_dir=tmp_path / "out")
    assert not (tmp_path / "profiles").exists()


def test_summary_shows_the_sign_of_the_error_per_backend():
    import pandas as pd

    from experiments import common

    df = pd.DataFrame({"backend": ["loop"] * 3 + ["grouped"] * 2, "pred_L3_s": [0.9, 1.8, 2.4, 1.1, 2.2],
                       "measured_s": [1.0, 2.0, 3.0, 1.0, 2.0], "round_cv": [0.0] * 5})
    summ = common.summary("x", "cpu", common.add_errors(df, levels=["L3"]), levels=["L3"])
    signed = summ["details"]["l3_over_measured"]
    assert list(signed) == ["grouped", "loop"]
    assert signed["loop"]["median"] == pytest.approx(0.9)  # 0.9, 0.9, 0.8
    assert signed["loop"]["p10"] == pytest.approx(0.82)  # numpy's linear interpolation: 0.8 + 0.2 * (0.9 - 0.8)
    assert signed["grouped"] == {"median": pytest.approx(1.1), "p10": pytest.approx(1.1), "p90": pytest.approx(1.1),
                                 "points": 2}
    with common.console.capture() as captured:
        common.print_summary(summ)
    assert "grouped 1.10x (1.10-1.10), loop 0.90x (0.82-0.90)" in captured.get()


def test_summary_gives_the_noise_floor_of_the_maximum():
    import pandas as pd

    from experiments import common

    # four points, each with round CV 0.1 over 3 rounds: sigma = sqrt(pi/2) * 0.1 / sqrt(3) = 0.07236
    df = pd.DataFrame({"pred_L3_s": [1.0] * 4, "measured_s": [1.0, 2.0, 3.0, 4.0], "round_cv": [0.1] * 4,
                       "rounds_timed": [3] * 4})
    summ = common.summary("x", "cpu", common.add_errors(df, levels=["L3"]), levels=["L3"])
    floor = summ["details"]["noise_floor_max_ape_pct"]
    # P(max <= x) = erf(x / (sigma sqrt 2))^4 = 0.5 -> erf(.) = 0.5^(1/4) = 0.8409 -> x = 1.40809 sigma
    assert floor["median"] == pytest.approx(100 * 1.408093 * 0.0723601, rel=1e-5)
    assert floor["p10"] < floor["median"] < floor["p90"]
    with common.console.capture() as captured:
        common.print_summary(summ)
    assert f"max APE over these 4 points would be ~{floor['median']:.1f}%" in captured.get()
    # errors 0%, 50%, 66.7%, 75% against 2 sigma = 14.5%: three of four points beyond the noise
    assert summ["details"]["l3_beyond_noise"] == {"share_beyond_2_sigma": 0.75, "points": 4,
                                                  "perfect_model_share": 0.0455}
    assert "L3 errors beyond twice the measurement noise: 75% of 4 points (a perfect model: 4.5%)" in captured.get()


def test_beyond_noise_counts_only_points_with_a_noise_estimate():
    import numpy as np

    from costmodel.model.evaluation import beyond_noise

    out = beyond_noise(np.array([0.05, -0.25, 0.5, 0.1]), np.array([0.1, 0.1, 0.0, float("nan")]))
    assert out == {"share_beyond_2_sigma": 0.5, "points": 2, "perfect_model_share": 0.0455}  # |-0.25| > 0.2
    assert beyond_noise(np.array([0.1]), np.array([0.0]))["share_beyond_2_sigma"] is None


def test_summary_names_the_drift_basis_and_the_profiled_row_ratios():
    from experiments import common

    summ = {"experiment": "x", "device": "cpu", "n_points": 1, "noise_cv_pct": 1.0,
            "median_ape_pct": {}, "p90_ape_pct": {}, "max_ape_pct": {}, "spearman": {},
            "details": {"heldout": {"scored": True, "fitted_rows": 10, "excluded_profile_rows": 2, "excluded_kernels": 2,
                                    "fit_s": 1.0, "drift": {"references": 2, "by_family": {"gemm": 0.9},
                                                            "overall": 0.9, "vs_profiled_row": {"gemm": 0.84}}}}}
    with common.console.capture() as captured:
        common.print_summary(summ)
    out = " ".join(captured.get().split())
    assert "measured now / the held-out model's time of 2 reference kernels" in out
    assert "gemm 0.90x, other families 0.90x (against their profiled rows: gemm 0.84x)" in out
