"""`place` of the benchmark's 10 tiny workloads on 2 devices (fast, no hog), the cost matrix
predicted once per distinct model, a ``PlacementWorkload`` as a ``Workload``, and
``scripts/bench_placement_busy.py``'s bad input and its hog (always stopped)."""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import fingerprint
from costmodel.model.predictor import CostModel
from sim.place.placement import Device, PlacementError, PlacementWorkload, cost_matrix, place
from sim.place.placement_workloads import mlp_workload
from sim.predict.simulator import predict_trace
from sim.workloads.workload import Workload

ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30


def _bench():
    spec = importlib.util.spec_from_file_location("bench_placement_busy", ROOT / "scripts" / "bench_placement_busy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


class CountingLevel:
    """A stand-in fitted level: seconds = 1 us + FLOPs / rate + bytes / (rate / 10); counts its calls."""

    def __init__(self, rate: float) -> None:
        self.rate, self.calls = rate, 0

    def predict(self, table: pd.DataFrame) -> np.ndarray:
        self.calls += 1
        return 1e-6 + table["flops"].to_numpy() / self.rate + table["bytes_moved"].to_numpy() / (self.rate / 10)


def _model(rate: float) -> CostModel:
    fp = replace(fingerprint(torch.device("cpu"), "float32", cold_cache=False), threads=1)
    return CostModel(fp, {"peak_flops_per_s": rate}, {"L0": CountingLevel(rate), "L3": CountingLevel(rate / 2)}, "hash")


@pytest.fixture(scope="module")
def workloads():
    return bench.tiny_workloads()


def test_ten_tiny_workloads_on_two_devices_get_a_valid_placement(workloads):
    devices = [Device("cpu0", _model(1e9), GIB), Device("cpu1", _model(3e9), GIB)]
    assert len(workloads) == 10 and len({w.name for w in workloads}) == 10
    assert [w.name for w in workloads[:5]] == ["mlp_balanced#0", "mlp_skinny#1", "moe#2", "gnn#3", "mlp_balanced#4"]
    p = place(workloads, devices, "L3")
    assert p.workloads == tuple(w.name for w in workloads) and p.devices == ("cpu0", "cpu1")
    assert sorted(sum(p.assignment().values(), [])) == sorted(p.workloads)  # each placed exactly once
    expected = np.array([[float(predict_trace(d.model, w.trace, ["L3"], quiet=True)["L3"].sum()) for d in devices]
                         for w in workloads])
    np.testing.assert_allclose(p.cost_s, expected, rtol=1e-12)
    assert p.makespan_s == pytest.approx(p.loads_s().max()) and p.makespan_s >= p.lower_bound_s * (1 - 1e-9)
    assert p.optimal and p.solver == "milp"
    used = np.zeros(2)
    np.add.at(used, np.asarray(p.device_of), [w.memory_bytes for w in workloads])
    assert (used <= GIB).all()


def test_the_cost_matrix_predicts_once_per_distinct_model(workloads):
    """Each level is called once per distinct model for all workloads together, not once
    per workload and device (the 20 calls that made place slow beside a hog)."""
    shared = _model(1e9)
    other = _model(2e9)
    devices = [Device("a", shared, GIB), Device("b", shared, GIB), Device("c", other, GIB)]
    cost = cost_matrix(workloads, devices, "L3")
    assert (shared.levels["L3"].calls, other.levels["L3"].calls) == (1, 1)
    assert shared.levels["L0"].calls == 0
    np.testing.assert_array_equal(cost[:, 0], cost[:, 1])
    for i, w in enumerate(workloads):
        assert cost[i, 2] == pytest.approx(float(predict_trace(other, w.trace, ["L3"], quiet=True)["L3"].sum()), rel=1e-12)


def test_a_placement_workload_is_a_workload():
    """One ``Workload`` (sim.workloads.workload): the experiments measure it, a placement places
    its subclass; FLOPs and bytes moved are the trace's either way."""
    factory = mlp_workload("x", batch=1, d_model=4, d_hidden=4).factory
    trace = [GemmSpec(8, 16, 32), GemmSpec(8, 32, 16)]
    placed = PlacementWorkload("p", trace, memory_bytes=0, factory=factory)
    plain = Workload("w", trace, lambda: None)
    assert isinstance(placed, Workload) and placed.trace == tuple(trace) and placed.run is None
    assert placed.flops == plain.flops == float(sum(s.flops() for s in trace)) > 0
    assert placed.bytes_moved == plain.bytes_moved == float(sum(s.bytes_moved() for s in trace)) > 0
    with pytest.raises(PlacementError, match=r"workload 'p': run must be None"):
        PlacementWorkload("p", trace, lambda: None, memory_bytes=0, factory=factory)
    with pytest.raises(TypeError, match="memory_bytes"):
        PlacementWorkload("p", trace, 0, factory)  # the placement's own fields are keyword-only


# ----------------------------------------------------------------------------- the benchmark script


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "error: --repeats must be in [1, 50], got 0\n"),
    (["--hog-processes", "65"], "error: --hog-processes must be in [1, 64], got 65\n"),
    (["--hog-seconds", "nan"], "error: --hog-seconds must be in [1, 600], got nan\n"),
    (["--hog-seconds", "1e9"], "error: --hog-seconds must be in [1, 600], got 1000000000.0\n"),
    (["--limit-s", "-1"], "error: --limit-s must be in [0.001, 3600], got -1.0\n"),
    (["--out", "{tmp}"], "error: --out {tmp} is a folder, not a file: name the JSON file to write\n"),
    (["--out", "{tmp}/f/x.json"], "error: --out {tmp}/f/x.json: {tmp}/f is a file, so no folder can be made below it\n"),
    (["--profile", "{tmp}"], "error: --profile {tmp} is not a device profile (no fingerprint.json in it)\n"),
])
def test_bad_input_is_one_line_before_anything_runs(argv, message, tmp_path, capsys, monkeypatch):
    (tmp_path / "f").write_text("x")
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("ran with bad input"))
    assert bench.main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert capsys.readouterr().err == message.format(tmp=tmp_path)


def test_the_hog_busy_loops_and_is_always_stopped():
    procs = bench.start_hog(2, seconds=30.0)
    try:
        time.sleep(0.2)
        assert [p.poll() for p in procs] == [None, None]  # spinning
    finally:
        started = time.monotonic()
        bench.stop_hog(procs)
    assert all(p.returncode is not None for p in procs) and time.monotonic() - started < 5
    short = bench.start_hog(1, seconds=0.05)  # ends by itself even if nobody stops it
    try:
        assert short[0].wait(timeout=10) == 0
    finally:
        bench.stop_hog(short)


def test_a_missed_target_exits_1_and_writes_the_json(tmp_path, monkeypatch, capsys):
    fake = {"quiet": bench.summary([0.2, 0.3, 0.25], [0.1, 0.2, 0.15], 0.5),
            "busy": bench.summary([1.5, 1.2, 1.3], [0.2, 0.3, 0.25], 2.25), "limit_s": 1.0,
            "passed": False, "hog": {"processes": 2, "max_seconds": 30.0}, "host": {"cpu_count": 2}}
    monkeypatch.setattr(bench, "run", lambda args: fake)
    out = tmp_path / "bench" / "placement_busy.json"
    assert bench.main(["--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "quiet            0.250     0.100    0.200    0.300         0.150       0.50" in text
    assert "beside hog       1.300     0.300    1.200    1.500         0.250       2.25" in text
    assert "busy median 1.300 s: OVER the 1 s target (2 hog processes, 2 CPUs)" in text
    assert json.loads(out.read_text())["busy"]["median_s"] == 1.3


def test_a_profile_that_cannot_predict_the_workloads_is_one_line(tmp_path, capsys, monkeypatch):
    def run(args):
        raise ValueError("L3 was fitted without families ['gather']; measure them\nand refit")

    monkeypatch.setattr(bench, "run", run)
    assert bench.main(["--out", str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err == "error: L3 was fitted without families ['gather']; measure them and refit\n"
    assert not (tmp_path / "x.json").exists()


def test_time_place_gives_wall_and_cpu_seconds_per_call(workloads):
    devices = [Device("cpu0", _model(1e9), GIB), Device("cpu1", _model(2e9), GIB)]
    wall, cpu = bench.time_place(workloads, devices, 2)
    assert len(wall) == len(cpu) == 2 and all(0 < w < 60 for w in wall) and all(0 <= c < 60 for c in cpu)
    s = bench.summary(wall, cpu, 1.5)
    assert s["median_s"] == pytest.approx(sum(wall) / 2) and s["cpu_times_s"] == cpu
    assert s["load_average_1min_before"] == 1.5
