"""Placement API: exact vs LPT on hand-checkable instances, gaps, heterogeneous speeds,
memory, the errors said before anything runs, and real runs in pinned worker processes."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.model.predictor import CostModel
from sim.place.executor import devices_can_run_together, run_placements
from sim.place.placement import Device, PlacementError, PlacementWorkload, cost_matrix, place, solve
from sim.place.placement_workloads import GNNFactory, calibration_suite, gnn_workload, mlp_workload, moe_workload
from sim.workloads.gnn_layer import GNNConfig

GIB = 2**30


class FlopsLevel:
    """A stand-in fitted level: seconds = FLOPs / rate."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def predict(self, table: pd.DataFrame) -> np.ndarray:
        return table["flops"].to_numpy() / self.rate


def _model(rate: float = 1e9, threads: int = 1) -> CostModel:
    fp = replace(fingerprint(torch.device("cpu"), "float32", cold_cache=False), threads=threads)
    return CostModel(fp, {"peak_flops_per_s": rate}, {"L0": FlopsLevel(rate), "L3": FlopsLevel(rate / 2)}, "hash")


def _device(name: str, rate: float = 1e9, memory: int = GIB, cores=None, threads: int = 1) -> Device:
    return Device(name, _model(rate, threads), memory, cores)


def _workload(name: str, gflop: float, memory: int = 0) -> PlacementWorkload:
    """A workload of one GEMM with ``gflop`` GFLOP (2MKN, M = gflop * 500, K = N = 1000)."""
    return PlacementWorkload(name, (GemmSpec(int(round(gflop * 500)), 1000, 1000),), memory_bytes=memory,
                             factory=mlp_workload("x", batch=1, d_model=4, d_hidden=4).factory)


def _from_table(times: dict[tuple[str, str], float]):
    def predict(w: PlacementWorkload, d: Device) -> float:
        return times[(w.name, d.name)]
    return predict


# ----------------------------------------------------------------------------- solvers


def test_exact_beats_lpt_on_the_tight_graham_instance():
    """Jobs 3, 3, 2, 2, 2 on two identical devices: optimum 6 ({3,3} | {2,2,2}); LPT gives
    7 (3|3, 2|2, then 2 on top), exactly Graham's 4/3 - 1/6 = 7/6 of optimal."""
    cost = np.repeat(np.array([[3.0], [3.0], [2.0], [2.0], [2.0]]), 2, axis=1)
    kw = dict(workloads=tuple("abcde"), devices=("x", "y"))
    mem, cap = np.zeros(5), np.ones(2)
    exact = solve(cost, mem, cap, solver="milp", **kw)
    greedy = solve(cost, mem, cap, solver="lpt", **kw)
    assert exact.solver == "milp" and exact.optimal and exact.gap_pct == 0
    assert exact.makespan_s == pytest.approx(6.0)
    assert sorted(map(sorted, exact.assignment().values())) == [["a", "b"], ["c", "d", "e"]]
    assert greedy.solver == "lpt" and not greedy.optimal
    assert greedy.makespan_s == pytest.approx(7.0)
    assert greedy.lower_bound_s == pytest.approx(6.0)  # LP relaxation: total 12 over 2 devices
    assert greedy.gap_pct == pytest.approx(100 / 6)
    assert "Graham" in greedy.note


def test_auto_switches_to_lpt_past_the_exact_size():
    cost = np.ones((6, 2))
    kw = dict(workloads=tuple("abcdef"), devices=("x", "y"))
    assert solve(cost, np.zeros(6), np.ones(2), exact_max_binaries=12, **kw).solver == "milp"
    lpt = solve(cost, np.zeros(6), np.ones(2), exact_max_binaries=11, **kw)
    assert lpt.solver == "lpt" and lpt.makespan_s == 3.0 and lpt.optimal  # 3 + 3 meets the lower bound


def test_heterogeneous_speeds_give_the_fast_device_more_work():
    """Three 4 s jobs; the fast device runs each in 2 s: optimum 4 s = two on the fast one."""
    workloads = [_workload(n, 1.0) for n in "abc"]
    fast, slow = _device("fast"), _device("slow")
    times = {(w.name, "fast"): 2.0 for w in workloads} | {(w.name, "slow"): 4.0 for w in workloads}
    p = place(workloads, [fast, slow], _from_table(times))
    assert p.makespan_s == pytest.approx(4.0) and p.optimal
    assert len(p.assignment()["fast"]) == 2 and len(p.assignment()["slow"]) == 1
    assert p.predictor == "predict"


def test_a_level_name_predicts_from_each_devices_model():
    """L0 here is FLOPs / rate: device y is 3x faster, so the 3 GFLOP job goes there alone."""
    workloads = [_workload("big", 3.0), _workload("small", 1.0)]
    devices = [_device("x", rate=1e9), _device("y", rate=3e9)]
    cost = cost_matrix(workloads, devices, "L0")
    assert cost[:, 0] == pytest.approx([3.0, 1.0], rel=1e-3) and cost[:, 1] == pytest.approx([1.0, 1 / 3], rel=1e-3)
    p = place(workloads, devices, "L0")
    assert p.assignment() == {"x": ["small"], "y": ["big"]}
    assert p.makespan_s == pytest.approx(1.0, rel=1e-3)
    assert place(workloads, devices, "L3").makespan_s == pytest.approx(2.0, rel=1e-3)  # L3 stand-in: half the rate


def test_placement_evaluates_under_other_latencies_and_draws_a_timeline():
    cost = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    p = solve(cost, np.zeros(3), np.ones(2), workloads=("a", "b", "c"), devices=("x", "y"))
    assert p.makespan_s == 3.0
    measured = cost * np.array([[1.0], [1.0], [2.0]])  # c really takes 6
    assert p.makespan_under(measured) == 6.0
    tl = p.timeline(measured)
    c = tl.set_index("workload").loc["c"]
    assert c["end_s"] - c["start_s"] == 6.0
    ends = tl.groupby("device")["end_s"].max()
    assert sorted(ends) == [3.0, 6.0]
    with pytest.raises(ValueError, match=r"cost_s must be \[workloads=3, devices=2\]"):
        p.makespan_under(np.ones((2, 2)))


def test_memory_constrains_where_a_workload_may_go():
    """'big' fits only device y: it must go there although x is as fast."""
    workloads = [_workload("big", 1.0, memory=3 * GIB), _workload("small", 1.0, memory=1)]
    devices = [_device("x", memory=2 * GIB), _device("y", memory=4 * GIB)]
    for solver in ("milp", "lpt"):
        p = place(workloads, devices, "L0", solver=solver)
        assert "big" in p.assignment()["y"]
        assert p.assignment()["x"] == ["small"]


def test_memory_sums_are_respected():
    """Two 3 GiB jobs cannot share a 4 GiB device, even when that device is much faster."""
    workloads = [_workload("a", 1.0, memory=3 * GIB), _workload("b", 1.0, memory=3 * GIB)]
    devices = [_device("fast", rate=1e12, memory=4 * GIB), _device("slow", rate=1e9, memory=4 * GIB)]
    p = place(workloads, devices, "L0")
    assert sorted(len(v) for v in p.assignment().values()) == [1, 1]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("workloads, devices, predict, message", [
    ([], [("x", GIB)], "L0", "no workloads"),
    ([("a", 0)], [], "L0", "no devices"),
    ([("a", 5 * GIB)], [("x", GIB), ("y", 2 * GIB)], "L0", r"workload 'a' needs 5,120.0 MiB, more than any device"),
    ([("a", GIB), ("b", GIB)], [("x", GIB)], "L0", "need 2,048.0 MiB together"),
    ([("a", 0)], [("x", GIB)], "L9", r"predict='L9' is not a level of device 'x'"),
    ([("a", 0), ("a", 0)], [("x", GIB)], "L0", r"workload names must be unique, repeated: \['a'\]"),
])
def test_bad_input_is_refused_before_solving(workloads, devices, predict, message):
    ws = [_workload(n, 1.0, memory=m) for n, m in workloads]
    ds = [_device(n, memory=m) for n, m in devices]
    with pytest.raises(PlacementError, match=message):
        place(ws, ds, predict)


def test_a_device_without_a_fitted_profile_is_refused(tmp_path):
    with pytest.raises(PlacementError, match="device 'x' has no fitted profile"):
        place([_workload("a", 1.0)], [Device("x", None, GIB)], "L0")
    fp = fingerprint(torch.device("cpu"), "float32")
    with pytest.raises(PlacementError, match=r"device 'y' has no fitted profile for .* under .*python -m costmodel bench"):
        Device.from_profile("y", tmp_path, fp, memory_bytes=GIB)
    assert not any(tmp_path.iterdir())  # nothing was created


def test_bad_costs_and_bad_workloads_are_named():
    with pytest.raises(PlacementError, match=r"finite seconds >= 0.*'a', 'x', -1.0"):
        place([_workload("a", 1.0)], [_device("x")], lambda w, d: -1.0)
    with pytest.raises(PlacementError, match="trace must list at least one kernel"):
        PlacementWorkload("a", (), memory_bytes=0, factory=_workload("b", 1.0).factory)
    with pytest.raises(PlacementError, match="memory_bytes must be an integer >= 0"):
        PlacementWorkload("a", (GemmSpec(1, 1, 1),), memory_bytes=-1, factory=_workload("b", 1.0).factory)
    with pytest.raises(PlacementError, match="factory must have a build"):
        PlacementWorkload("a", (GemmSpec(1, 1, 1),), memory_bytes=0, factory=object())
    with pytest.raises(PlacementError, match="solver must be one of"):
        place([_workload("a", 1.0)], [_device("x")], "L0", solver="cplex")


# ----------------------------------------------------------------------------- layer workloads


def test_layer_workloads_carry_trace_memory_and_a_suite():
    moe = moe_workload("moe", tokens=16, d_model=16, d_ff=16, num_experts=4, top_k=2, zipf_exponent=1.0)
    gnn = gnn_workload("gnn", num_nodes=64, num_edges=256, width=4, rmat_a=0.6)
    mlp = mlp_workload("mlp", batch=2, d_model=8, d_hidden=16)
    assert mlp.memory_bytes >= 4 * 2 * 8 * 16  # at least its weights
    assert moe.memory_bytes >= 4 * 3 * 4 * 16 * 16
    for w in (moe, gnn, mlp):
        out = w.factory.build(torch.device("cpu"))()
        assert torch.isfinite(out).all()
    keys = {s.key() for _, s in calibration_suite([moe, gnn, mlp])}
    assert len(keys) == len(calibration_suite([moe, gnn, mlp]))  # each kernel once
    assert any(k.startswith("family=grouped_gemm") or "family=gemm" in k for k in keys)
    with pytest.raises(ValueError, match=r"rmat_a must be in \[0.25, 1\)"):
        gnn_workload("g", num_nodes=64, num_edges=256, width=4, rmat_a=1.5)


# ----------------------------------------------------------------------------- real runs

two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


@two_cores
def test_placements_run_for_real_on_pinned_workers():
    workloads = [mlp_workload(f"m{i}", batch=4, d_model=16, d_hidden=32, seed=i) for i in range(3)]
    devices = [_device("c0", cores=(0,)), _device("c1", cores=(1,))]
    assert devices_can_run_together(devices)
    a = place(workloads, devices, _from_table({(w.name, d.name): 1.0 + i for i, w in enumerate(workloads)
                                               for d in devices}))
    b = solve(np.ones((3, 2)), np.zeros(3), np.ones(2), workloads=a.workloads, devices=a.devices, solver="lpt")
    runs = run_placements([a, b, a], workloads, devices, repeats=2, progress=False)
    assert set(runs) == {a.key(), b.key()}  # the repeated placement ran once
    for p in (a, b):
        run = runs[p.key()]
        assert run.concurrent and run.walls_s.shape == (2, 2) and (run.walls_s >= 0).all()
        spans = run.spans
        assert len(spans) == 2 * len(workloads)  # every workload once per repeat
        placed = {w: d for d, ws in p.assignment().items() for w in ws}
        assert all(placed[r.workload] == r.device for r in spans.itertuples())
        assert run.measured_makespan_s >= spans["end_s"].min() > 0
        tl = run.timeline()
        assert set(tl["workload"]) == set(p.workloads)


@two_cores
def test_overlapping_devices_run_one_after_the_other_and_worker_errors_surface():
    workloads = [mlp_workload("m", batch=2, d_model=8, d_hidden=8)]
    devices = [_device("both", cores=(0, 1), threads=2), _device("one", cores=(1,))]
    assert not devices_can_run_together(devices)
    p = place(workloads, devices, "L0")
    run = run_placements([p], workloads, devices, repeats=1, progress=False)[p.key()]
    assert not run.concurrent and run.walls_s.shape == (1, 2)
    bad = PlacementWorkload("bad", workloads[0].trace, memory_bytes=0,
                            factory=GNNFactory(GNNConfig(num_nodes=4, in_features=2, out_features=2),
                                               np.array([[0, 9], [1, 2]]), (0.0, 1.0), 0))
    pb = place([bad], devices[1:], "L0")
    with pytest.raises(RuntimeError, match=r"device worker 'one' failed:(.|\n)*edge_index values must be in"):
        run_placements([pb], [bad], devices[1:], repeats=1, progress=False)
    with pytest.raises(PlacementError, match="cores .* are not available"):
        run_placements([p], workloads, [_device("both", cores=(0, 4096)), devices[1]], repeats=1, progress=False)


def test_tied_placements_give_the_regret_range_of_equally_good_answers():
    """a and b tie under the predictor (same cost) but really take 1 s and 3 s; c takes 2 s.
    Optimal by prediction: {a|b} split with c on either side (4 placements); realised: best
    {b | a, c} = 3 s (regret 0), worst {a | b, c} = 5 s (+66.7%)."""
    from experiments.placement import tied_placements

    predicted = np.repeat(np.array([[1.0], [1.0], [0.0]]), 2, axis=1)
    measured = np.repeat(np.array([[1.0], [3.0], [2.0]]), 2, axis=1)
    ties = tied_placements(predicted, measured)
    assert ties["placements"] == 4
    assert ties["regret_pct_min"] == pytest.approx(0.0)
    assert ties["regret_pct_max"] == pytest.approx(200 / 3)
    assert tied_placements(np.ones((19, 2)), np.ones((19, 2))) is None  # 2^19 assignments: not enumerated


def make_tiny_matmul(device, size=4):
    """An ImportedFactory target for the test below."""
    a = torch.ones(size, size, device=device)
    return lambda: a @ a


def test_any_trace_plugs_in_with_an_imported_factory():
    """A captured module's descriptors and a runnable named by import path make a workload
    like any layer's: placed, given a calibration suite around its trace, built and run."""
    from sim.place.placement_workloads import ImportedFactory, trace_suite, trace_workload

    trace = (GemmSpec(4, 4, 4), GemmSpec(64, 256, 128))
    factory = ImportedFactory(f"{__name__}.make_tiny_matmul", (("size", 3),))
    w = trace_workload("captured", trace, factory, resident_bytes=100)
    assert w.memory_bytes == 100 + GemmSpec(64, 256, 128).bytes_moved()
    assert w.factory.build(torch.device("cpu"))().shape == (3, 3)
    assert len(calibration_suite([w])) == len(trace_suite(trace)) > 0
    assert place([w], [_device("x")], "L0").assignment() == {"x": ["captured"]}


# ----------------------------------------------------------------------------- bad input (issue 28)


class FakeWorkload:
    """Looks like a workload (a name, a memory size) but has no trace and is no PlacementWorkload."""

    name = "fake"
    memory_bytes = 0
    trace = ()


@pytest.mark.parametrize("make, message", [
    (lambda ws, ds: (ws + [FakeWorkload()], ds), r"workloads\[2\] \('fake'\) is a FakeWorkload, not a sim.place.placement.PlacementWorkload"),
    (lambda ws, ds: (["a"], ds), r"workloads\[0\] \('a'\) is a str, not a sim.place.placement.PlacementWorkload"),
    (lambda ws, ds: (ws, ds + ["gpu"]), r"devices\[1\] \('gpu'\) is a str, not a sim.place.placement.Device"),
    (lambda ws, ds: ("ab", ds), r"workloads must be a list of sim.place.placement.PlacementWorkload, got str"),
])
def test_what_is_not_a_workload_or_device_is_refused_by_name(make, message):
    ws, ds = make([_workload("a", 1.0), _workload("b", 1.0)], [_device("x")])
    with pytest.raises(PlacementError, match=message):
        place(ws, ds, "L3")


def test_a_workload_whose_trace_was_emptied_is_refused():
    w = _workload("a", 1.0)
    object.__setattr__(w, "trace", ())  # past the constructor's check
    with pytest.raises(PlacementError, match=r"workloads\[0\] \('a'\): trace must list at least one kernel"):
        place([w], [_device("x")], "L0")


@pytest.mark.parametrize("value", ["1.0", None, True, [1.0]])
def test_a_predictor_returning_no_number_is_named(value):
    with pytest.raises(PlacementError, match=r"must return seconds as a number .* workload 'a' on device 'x' it returned"):
        place([_workload("a", 1.0)], [_device("x")], lambda w, d: value)


def test_bools_are_no_sizes_counts_or_limits():
    with pytest.raises(PlacementError, match="device 'x': memory_bytes must be a positive integer, got True"):
        Device("x", _model(), True)
    with pytest.raises(PlacementError, match="workload 'a': memory_bytes must be an integer >= 0, got True"):
        PlacementWorkload("a", (GemmSpec(1, 1, 1),), memory_bytes=True, factory=_workload("b", 1.0).factory)
    with pytest.raises(PlacementError, match="cores must be a list of distinct integer core ids"):
        Device("x", _model(), GIB, (True,))
    with pytest.raises(PlacementError, match="cores must be distinct"):
        Device("x", _model(), GIB, (0, 0))
    ws, ds = [_workload("a", 1.0)], [_device("x")]
    with pytest.raises(PlacementError, match="exact_max_binaries must be an integer >= 0, got True"):
        place(ws, ds, "L0", exact_max_binaries=True)
    for limit in (True, float("nan"), float("inf"), "20", 0):
        with pytest.raises(PlacementError, match="time_limit_s must be a finite number of seconds > 0"):
            place(ws, ds, "L0", time_limit_s=limit)


_KW = dict(workloads=("a", "b", "c"), devices=("x", "y"))


@pytest.mark.parametrize("cost, names, message", [
    ([[np.nan, 1], [1, 1], [1, 1]], _KW, r"cost_s must hold finite seconds >= 0; 1 do not, .*\('a', 'x', nan\)"),
    ([[np.inf, 1], [1, 1], [1, 1]], _KW, r"cost_s must hold finite seconds >= 0; 1 do not, .*\('a', 'x', inf\)"),
    ([[1, 1], [1, -2], [1, 1]], _KW, r"cost_s must hold finite seconds >= 0; 1 do not, .*\('b', 'y', -2.0\)"),
    (np.ones((3, 2)), dict(workloads=("a",), devices=("x", "y")),
     r"cost_s must have shape \[1, 2\] \(one row per workload name \(1\), one column per device name \(2\)\), got \[3, 2\]"),
    (np.ones(3), _KW, r"cost_s must have shape \[3, 2\]"),
    ([["1", "1"]] * 3, _KW, r"cost_s must be an array of numbers"),
    (np.ones((3, 2)), dict(workloads=("a", "a", "c"), devices=("x", "y")), r"workloads must be unique, repeated: \['a'\]"),
    (np.ones((3, 2)), dict(workloads="abc", devices=("x", "y")), r"workloads must be a list of names"),
])
def test_solve_checks_the_cost_matrix_before_solving(cost, names, message):
    for solver in ("milp", "lpt"):
        with pytest.raises(PlacementError, match=message):
            solve(cost, np.zeros(len(names["workloads"])), np.ones(2), solver=solver, **names)


def test_solve_checks_memory_and_capacities():
    cost = np.ones((3, 2))
    with pytest.raises(PlacementError, match=r"memory_bytes must have shape \[3\]"):
        solve(cost, np.zeros(2), np.ones(2), **_KW)
    with pytest.raises(PlacementError, match=r"memory_bytes must be finite bytes >= 0; .*\('b', nan\)"):
        solve(cost, np.array([0, np.nan, 0]), np.ones(2), **_KW)
    with pytest.raises(PlacementError, match=r"capacity_bytes must be finite bytes > 0; .*\('y', 0.0\)"):
        solve(cost, np.zeros(3), np.array([1.0, 0.0]), **_KW)


class _FakeMilp:
    """scipy.optimize.milp as HiGHS answers at its time limit: ``x`` is its incumbent
    (None: none found), status 1."""

    def __init__(self, x, gap=0.5, bound=0.0):
        self.x, self.gap, self.bound = x, gap, bound

    def __call__(self, c, **kwargs):
        from scipy.optimize import OptimizeResult

        assert kwargs["options"]["time_limit"] == 20.0  # the limit reaches HiGHS
        return OptimizeResult(x=self.x, status=1, message="Time limit reached. (HiGHS Status 13)", fun=None,
                              mip_gap=self.gap, mip_dual_bound=self.bound, success=False)


GRAHAM = np.repeat(np.array([[3.0], [3.0], [2.0], [2.0], [2.0]]), 2, axis=1)  # optimum 6, LPT 7


def _x(device_of, m=2):
    x = np.zeros(len(device_of) * m + 1)
    for i, d in enumerate(device_of):
        x[i * m + d] = 1.0
    return x


def test_a_time_limited_solver_without_a_placement_falls_back_to_lpt(monkeypatch):
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "milp", _FakeMilp(None, gap=np.nan))
    p = solve(GRAHAM, np.zeros(5), np.ones(2), workloads=tuple("abcde"), devices=("x", "y"), solver="milp")
    assert p.solver == "lpt" and p.makespan_s == pytest.approx(7.0) and not p.optimal
    assert "found no placement within time_limit_s=20" in p.note and "LPT's placement instead" in p.note
    assert p.lower_bound_s == pytest.approx(6.0)  # sum of fastest times / devices, no solver needed
    assert p.gap_pct == pytest.approx(100 / 6)


def test_a_time_limited_solver_returns_its_best_placement_and_gap(monkeypatch):
    import scipy.optimize

    monkeypatch.setattr(scipy.optimize, "milp", _FakeMilp(_x([0, 0, 1, 1, 1]), gap=0.02, bound=5.9 / GRAHAM.mean()))
    p = solve(GRAHAM, np.zeros(5), np.ones(2), workloads=tuple("abcde"), devices=("x", "y"), solver="auto")
    assert p.solver == "milp" and p.makespan_s == pytest.approx(6.0) and not p.optimal
    assert p.note.startswith("time limit 20 s reached after") and "HiGHS gap 2.00%" in p.note
    assert p.lower_bound_s == pytest.approx(6.0)  # the bound of HiGHS (5.9) is weaker than total / devices here
    # an incumbent worse than LPT's placement: LPT's is returned, and said
    monkeypatch.setattr(scipy.optimize, "milp", _FakeMilp(_x([0, 0, 0, 1, 1])))
    p = solve(GRAHAM, np.zeros(5), np.ones(2), workloads=tuple("abcde"), devices=("x", "y"), solver="milp")
    assert p.makespan_s == pytest.approx(7.0) and "LPT's placement, better than the solver's" in p.note


def test_auto_solves_a_thousand_workloads_exactly_by_default():
    from sim.place.placement import EXACT_MAX_BINARIES

    assert EXACT_MAX_BINARIES >= 1000 * 4  # 1,000 workloads on 4 devices go to the time-limited solver


def test_colocated_devices_pay_their_factors_at_the_pools_pressure():
    """Each device runs beside the pool's average neighbour: pressure = the pool's bytes beyond the
    private cache over its predicted seconds over the stream's rate, factor 1 + (stream - 1) x P."""
    from costmodel.colocation import ColocationFactors
    from sim.place.placement import pool_pressure

    workloads = [_workload("a", 1.0), _workload("b", 2.0)]  # 8 MB and 12 MB moved; L3 2 s and 4 s
    factors = ColocationFactors(factors={"gemm": 1.0}, placement={"id": "cores0-1-w2"}, measured_at="", source="t",
                                kernels={"gemm": [{"bytes_moved": 1e6, "ratio": 1.0, "stream_ratio": 1.6}]},
                                stream_bytes_per_s=1e7, private_cache_bytes=2.0**20)
    devices = [replace(_device(n, cores=(c,)), colocation=factors) for c, n in enumerate("xy")]
    pressure = (8e6 + 12e6) / (2.0 + 4.0) / 1e7
    assert pool_pressure(workloads, devices[0], "L3") == pytest.approx(pressure)
    cost = cost_matrix(workloads, devices, "L3")
    np.testing.assert_allclose(cost[:, 0], np.array([2.0, 4.0]) * (1 + 0.6 * pressure), rtol=1e-3)
    twin_only = replace(factors, stream_bytes_per_s=None)  # measured without the stream: the twin's 1.0
    assert pool_pressure(workloads, replace(devices[0], colocation=twin_only), "L3") is None
    np.testing.assert_allclose(cost_matrix(workloads, [replace(devices[0], colocation=twin_only)], "L3")[:, 0],
                               [2.0, 4.0], rtol=1e-3)


def test_a_placements_contended_makespan_follows_what_runs_side_by_side():
    """a (L3 2 s alone, 8 MB) and b (4 s, 12 MB) on two devices: sensitivity 0.6 each (stream ratio
    1.6), pressure a 0.4 and b 0.3 (bytes / alone seconds / 1e7 B/s). a runs at 1/1.18 beside b and
    ends at 2.36 s; b runs at 1/1.24 until then (1.903 s of work done), alone after: 4.457 s."""
    from costmodel.colocation import ColocationFactors
    from sim.place.placement import contended_makespan

    workloads = [_workload("a", 1.0), _workload("b", 2.0)]
    factors = ColocationFactors(factors={"gemm": 1.0}, placement={"id": "cores0-1-w2"}, measured_at="", source="t",
                                kernels={"gemm": [{"bytes_moved": 1e6, "ratio": 1.0, "stream_ratio": 1.6}]},
                                stream_bytes_per_s=1e7, private_cache_bytes=2.0**20)
    devices = [replace(_device(n, cores=(c,)), colocation=factors) for c, n in enumerate("xy")]
    p = place(workloads, devices, "L3")
    assert sorted(p.device_of) == [0, 1]
    makespan, timeline = contended_makespan(p, devices, "L3", workloads)
    assert makespan == pytest.approx(2.0 * 1.18 + (4.0 - 2.0 * 1.18 / 1.24), rel=1e-3)
    assert timeline.set_index("workload").loc["a", "end_s"] == pytest.approx(2.36, rel=1e-3)
    assert timeline["pressure"].tolist() == pytest.approx([0.4, 0.3], rel=1e-3)
    measured = np.array([[1.0, 1.0], [1.0, 1.0]])  # the contention model on other latencies alone
    again, _ = contended_makespan(p, devices, "L3", workloads, alone_s=measured)
    # 1 s each, pressures still from L3's seconds: a ends at 1.18 s, b (beside a's 0.4) has 1 - 1.18/1.24 left
    assert again == pytest.approx(1.18 + (1.0 - 1.18 / 1.24), rel=1e-3)
    assert contended_makespan(p, [_device("x", cores=(0,)), _device("y", cores=(1,))], "L3", workloads) is None
