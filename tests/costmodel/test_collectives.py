"""Collectives as a measured kernel family: bytes formulas, a real 2-rank gloo run into a
collective profile (fingerprint, append without loss), the L2 fit, bad inputs' messages,
and no orphan process after a rank dies."""

from __future__ import annotations

import json
import re
import socket

import numpy as np
import pandas as pd
import psutil
import pytest

from costmodel.collectives import (CollectiveProfileError, CollectiveSpec, CollectiveSpecError, bench_collectives,
                                   load_collective_model, make_latency_bandwidth_model)
from costmodel.collectives.models import (CollectiveModel, LatencyBandwidth, fit_collective_model, home_share,
                                          training_rows)
from costmodel.collectives.rank import fail_mid_run
from costmodel.collectives.report import fit_report
from costmodel.collectives.spec import all_to_all_bytes, check_send_matrix
from costmodel.collectives.store import CollectiveProfile
from costmodel.collectives.suite import load_suite
from costmodel.collectives.workers import EPWorkerError, WorkerSetupError, usable_cores

TINY = {"name": "tiny", "sizes": {"min_bytes": 256, "max_bytes": 65536, "count": 3},
        "all_to_all": {"peer_share": [0.9], "skew": [4]},
        "timing": {"warmup": 1, "min_repeats": 3, "max_repeats": 5, "budget_s": 0.01},
        "step": {"repeats": 3, "evict_bytes": 1048576, "lead_s": 1e-4}, "timeout_s": 120}
N_TINY = 3 * (2 + 3)  # 3 sizes x (2 all_to_all patterns + 3 other ops)
PROTOCOLS = 2  # every collective timed warm and in the step protocol
SMALLEST = {**TINY, "sizes": {"min_bytes": 256, "max_bytes": 256, "count": 1}, "ops": ["all_to_all", "all_reduce"]}
N_SMALLEST = 2 + 1


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("op, w, n, moved", [
    ("all_reduce", 4, 1000 * 16, 2 * 3 / 4 * 16000),  # 2(W-1)/W n
    ("all_gather", 4, 1000 * 16, 3 / 4 * 16000),  # (W-1)/W n
    ("reduce_scatter", 2, 1024, 512),
    ("all_reduce", 2, 1024, 1024),
])
def test_bus_bytes_follow_nccl_tests(op, w, n, moved):
    spec = CollectiveSpec(op, w, message_bytes=n)
    np.testing.assert_allclose(spec.bytes_moved(), np.full(w, moved))


def test_all_to_all_bytes_are_off_diagonal_send_plus_receive():
    b = all_to_all_bytes(np.array([[10, 20], [30, 40]]))
    np.testing.assert_array_equal(b["sent"], [20, 30])
    np.testing.assert_array_equal(b["recv"], [30, 20])
    np.testing.assert_array_equal(b["moved"], [50, 50])
    np.testing.assert_array_equal(b["home"], [10, 40])
    b3 = all_to_all_bytes(np.array([[0, 4, 8], [12, 0, 0], [0, 0, 100]]))
    np.testing.assert_array_equal(b3["sent"], [12, 12, 0])
    np.testing.assert_array_equal(b3["recv"], [12, 4, 8])
    np.testing.assert_array_equal(b3["moved"], [24, 16, 8])


def test_suite_patterns_match_their_names():
    suite = load_suite(TINY, 2)
    assert len(suite.specs) == N_TINY
    by = {(s.pattern, s.nominal_bytes): s for s in suite.specs if s.op == "all_to_all"}
    np.testing.assert_array_equal(by[("peer0.9", 256.0)].matrix.sum(axis=1), [256, 256])
    assert by[("peer0.9", 256.0)].matrix[0, 1] == pytest.approx(0.9 * 256, abs=4)
    np.testing.assert_array_equal(by[("skew4", 65536.0)].matrix, [[131072, 131072], [32768, 32768]])


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("make, message", [
    (lambda: CollectiveSpec("all_reduce", 2, message_bytes=-4), "message_bytes must be a finite byte count"),
    (lambda: CollectiveSpec("all_reduce", 2, message_bytes=float("inf")), "message_bytes must be a finite byte count"),
    (lambda: CollectiveSpec("all_gather", 2, message_bytes=6), "message_bytes for all_gather must be a multiple of 8 B"),
    (lambda: CollectiveSpec("broadcast", 2, message_bytes=4), "op must be one of ['all_to_all'"),
    (lambda: CollectiveSpec("all_to_all", 3, send_bytes=np.zeros((2, 2))), "send_bytes must have shape [3, 3]"),
    (lambda: CollectiveSpec("all_to_all", 2, send_bytes=[[0, np.nan], [4, 4]]), "send_bytes[0, 1] must be a finite"),
    (lambda: CollectiveSpec("all_to_all", 2, send_bytes=[[0, -8], [4, 4]]), "send_bytes[0, 1] must be a finite"),
    (lambda: CollectiveSpec("all_reduce", 0, message_bytes=4), "world_size must be an integer in [1, 1024], got 0"),
    (lambda: check_send_matrix(np.zeros(4)), "send_bytes must have shape [W, W]"),
    (lambda: make_latency_bandwidth_model(1e-5, 0, 2), "beta_bytes_per_s must be a finite number of bytes/s > 0"),
    (lambda: load_suite({**TINY, "timing": {"min_repeats": 1}}, 2), "timing.min_repeats must be an integer in [3,"),
    (lambda: load_suite({**TINY, "step": {"repeats": 1}}, 2), "suite: step.repeats must be an integer in [3, 1000], "
                                                              "got 1"),
    (lambda: load_suite({**TINY, "step": {"lead_s": 1.0}}, 2), "suite: step.lead_s must be a number in [0.0, 0.1], "
                                                               "got 1.0"),
    (lambda: load_suite({**TINY, "step": {"evict": 4}}, 2), "suite: unknown step field(s) ['evict']; allowed: "
                                                            "['repeats', 'evict_bytes', 'lead_s']"),
    (lambda: load_collective_model(protocol="cold"), "protocol must be one of ['warm', 'step'], got 'cold'"),
])
def test_bad_input_names_the_field(make, message):
    with pytest.raises(CollectiveSpecError, match=re.escape(message)):
        make()


def test_model_rejects_bad_matrix_and_bytes():
    model = make_latency_bandwidth_model(1e-4, 1e9, 2)
    with pytest.raises(CollectiveSpecError, match=re.escape("send_bytes must have shape [W, W]")):
        model.predict_all_to_all_s(np.zeros((2, 3)), level="L2")
    with pytest.raises(CollectiveSpecError, match="bytes_per_rank must be a finite byte count"):
        model.predict_s("all_reduce", float("nan"), level="L2")
    with pytest.raises(ValueError, match=re.escape("level must be one of ['L2'] for this model, got 'L3'")):
        model.predict_s("all_reduce", 1024)


def test_world_size_beyond_the_cores_is_refused_before_any_process(tmp_path):
    n = len(usable_cores())
    with pytest.raises(WorkerSetupError, match=re.escape(f"world_size={n + 1} cannot be placed one rank per core: "
                                                         f"this process may use {n} core(s), so world_size must be "
                                                         f"in [1, {n}]; pass allow_oversubscribe=True")):
        bench_collectives(n + 1, TINY, tmp_path, measure_lock=False, progress=False)
    assert not list(tmp_path.iterdir())  # nothing written


def test_port_in_use_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(WorkerSetupError, match=f"port {port} on 127.0.0.1 is in use"):
            bench_collectives(2, TINY, tmp_path, port=port, allow_oversubscribe=True, measure_lock=False,
                              progress=False)


def test_missing_profile_names_the_folder_and_the_command(tmp_path):
    with pytest.raises(CollectiveProfileError, match=re.escape("collectives/gloo-w2-")) as err:
        load_collective_model(world_size=2, backend="gloo", profile_root=tmp_path, measure_if_missing=False)
    assert f"python -m costmodel.collectives bench world_size=2 profile_root={tmp_path}" in str(err.value)


# ----------------------------------------------------------------------------- models


def test_l2_recovers_alpha_and_beta_from_synthetic_rows():
    rng = np.random.default_rng(0)
    alpha, beta = 50e-6, 2e9
    b = np.geomspace(256, 16 * 2 ** 20, 40)
    t = (alpha + b / beta) * (1 + 0.01 * rng.standard_normal(len(b)))
    est = LatencyBandwidth().fit(b, t)
    assert est.alpha_s_ == pytest.approx(alpha, rel=0.03)
    assert est.beta_bytes_per_s_ == pytest.approx(beta, rel=0.03)


def test_latency_bandwidth_model_predicts_the_formula():
    model = make_latency_bandwidth_model(1e-4, 1e9, 4)
    assert model.levels == ("L2",)
    assert model.predict_s("all_reduce", 4e6, level="L2") == pytest.approx(1e-4 + 2 * 3 / 4 * 4e6 / 1e9)
    s = np.array([[0, 1e6, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 5e5]])
    np.testing.assert_allclose(model.predict_all_to_all_s(s, level="L2"), 1e-4 + np.array([1e6, 1e6, 0, 0]) / 1e9)
    assert "extrapolating all_to_all" in model.extrapolating(s)


class _BlowsUpWithoutHomeBytes:
    """An L3 stand-in that is sane where measured (home share >= 0.1) and absurd at 0."""

    def predict(self, X):
        return 1e-3 * 0.1 / np.maximum(X["home_share"].to_numpy(float), 1e-6)


def test_l3_outside_the_measured_box_follows_l2_from_the_nearest_measured_call():
    l2 = make_latency_bandwidth_model(1e-4, 1e9, 2).l2["all_to_all"]
    box = {"home_share": (0.1, 0.9), "log_moved": (8.0, 25.0)}
    model = CollectiveModel(world_size=2, backend="gloo", fingerprint={}, l2={"all_to_all": l2},
                            l3={"all_to_all": _BlowsUpWithoutHomeBytes()}, ranges={"all_to_all": {
                                "min_bytes_moved": 256.0, "max_bytes_moved": 2.0 ** 25, "max_imbalance": 1.0,
                                "features": box}})
    exchange = np.array([[0.0, 4e6], [4e6, 0.0]])  # a halo: nothing kept home
    # clipped to home share 0.1, where the stand-in answers 1 ms; same bytes moved, so the L2 ratio is 1
    np.testing.assert_allclose(model.predict_all_to_all_s(exchange, level="L3"), [1e-3, 1e-3])
    far = np.array([[0.0, 2.0 ** 26], [2.0 ** 26, 0.0]])  # beyond the bytes measured too: carried along L2
    ratio = l2.predict(np.array([2.0 ** 27])) / l2.predict(np.array([2.0 ** 25 - 1]))
    np.testing.assert_allclose(model.predict_all_to_all_s(far, level="L3"), np.full(2, 1e-3 * ratio[0]), rtol=1e-6)
    inside = np.array([[4e6, 4e6], [4e6, 4e6]])  # home share 0.5: the model as fitted
    np.testing.assert_allclose(model.predict_all_to_all_s(inside, level="L3"), [2e-4, 2e-4])
    assert "share of a rank's bytes kept home 0 lies outside the measured 0.1..0.9" in model.extrapolating(exchange)
    assert model.extrapolating(inside) is None


def test_each_protocol_is_fitted_on_its_own_rows_and_statistic():
    """Warm rows are fitted on their median, step rows on their mean (the heavy tail a step adds
    up); a row of the other protocol is never used."""
    base = {"op": "all_to_all", "nominal_bytes": 256.0, "median_s": 1e-4}
    frame = pd.DataFrame([{**base, "protocol": "warm", "mean_s": 9e-4},
                          {**base, "protocol": "step", "mean_s": 3e-4},
                          {**base, "protocol": "step", "mean_s": float("nan")}])  # a row without its mean
    np.testing.assert_allclose(training_rows(frame, "warm")["target_s"], [1e-4])
    np.testing.assert_allclose(training_rows(frame, "step")["target_s"], [3e-4])
    old = frame.drop(columns=["protocol", "mean_s"]).iloc[:1]  # a profile written before the protocols
    np.testing.assert_allclose(training_rows(old, "warm")["target_s"], [1e-4])
    assert training_rows(old, "step").empty


def test_home_share_is_bounded_and_zero_without_bytes():
    np.testing.assert_allclose(home_share([10, 0, 0], [30, 5, 0]), [0.25, 0.0, 0.0])


# ----------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    first = bench_collectives(2, TINY, root, allow_oversubscribe=True, measure_lock=False, progress=False)
    rows_first = CollectiveProfile.load(first.path).measurements()
    second = bench_collectives(2, SMALLEST, root, allow_oversubscribe=True, measure_lock=False, progress=False)
    return {"root": root, "first": first, "second": second, "rows_first": rows_first}


def test_a_real_run_writes_rows_with_its_fingerprint(measured):
    first = measured["first"]
    assert first.rows_added == PROTOCOLS * 2 * N_TINY  # one row per (collective, protocol, rank)
    fp = json.loads((first.path / "fingerprint.json").read_text())
    assert (fp["backend"], fp["world_size"], fp["placement"]) == ("gloo", 2, first.placement)
    assert first.path.name == f"gloo-w2-{first.placement}"
    assert first.path.parent.parent.name == fp["device"]["id"]  # under the host's device profile folder
    rows = measured["rows_first"]
    assert set(rows["op"]) == {"all_to_all", "all_gather", "reduce_scatter", "all_reduce"}
    assert (rows["median_s"] > 0).all() and (rows["max_over_ranks_median_s"] >= rows["median_s"] * 0.999).all()
    assert rows.groupby("protocol").size().to_dict() == {"step": 2 * N_TINY, "warm": 2 * N_TINY}
    assert (rows["mean_s"] > 0).all() and (rows["max_over_ranks_mean_s"] >= rows["mean_s"] * 0.999).all()


def test_appending_keeps_every_row(measured):
    second = measured["second"]
    assert second.rows_total == PROTOCOLS * 2 * (N_TINY + N_SMALLEST)
    rows = CollectiveProfile.load(second.path).measurements()
    kept = rows[rows["run_id"] == measured["first"].run_id].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, measured["rows_first"], check_dtype=False)


def test_a_model_loads_from_the_measured_profile(measured):
    model = load_collective_model(world_size=2, backend="gloo", profile_root=measured["root"])
    assert model.levels == ("L2", "L3") and model.world_size == 2 and model.backend == "gloo"
    assert model.fingerprint["placement"] == measured["first"].placement
    s = np.array([[1024.0, 3072.0], [512.0, 512.0]])
    for level in model.levels:
        t = model.predict_all_to_all_s(s, level=level)
        assert t.shape == (2,) and np.all(t > 0)
        assert model.predict_s("all_reduce", 4096, level=level) > 0
    assert model.extrapolating(s) is None
    assert "world size 4 was not measured" in model.extrapolating(np.full((4, 4), 1024.0))
    assert "outside the measured" in model.extrapolating(np.full((2, 2), 2.0 ** 30))
    step = load_collective_model(world_size=2, backend="gloo", profile_root=measured["root"], protocol="step")
    assert (model.protocol, step.protocol) == ("warm", "step")
    assert step.predict_all_to_all_s(s, level="L2") != pytest.approx(model.predict_all_to_all_s(s, level="L2"))
    report = fit_report(CollectiveProfile.load(measured["first"].path).measurements(), print_table=False)
    assert set(report["level"]) == {"L2", "L3"} and report["median_ape_pct"].notna().all()
    assert set(report["protocol"]) == {"warm", "step"}


def test_cores_kept_awake_and_parked_cores_are_different_profiles(measured):
    """The default bench keeps the ranks' cores awake and says so in its placement; a model of
    parked cores is never fitted on those rows: it asks for its own bench."""
    from costmodel.collectives.store import placement_name

    assert placement_name((0, 1), keep_awake=True) == "cores0-1-awake"
    assert placement_name((0, 1)) == "cores0-1" and placement_name(None, keep_awake=True) == "unpinned"
    if measured["first"].placement == "unpinned":
        pytest.skip("one core: the ranks were not pinned, so no core was kept awake")
    assert measured["first"].placement.endswith("-awake")
    assert "kept awake: one SCHED_IDLE spinner per rank core" in measured["first"].note
    with pytest.raises(CollectiveProfileError, match="keep_awake=false"):
        load_collective_model(world_size=2, backend="gloo", profile_root=measured["root"], keep_awake=False)


def test_a_profile_of_parked_cores_is_not_read_for_awake_ones(measured, tmp_path):
    """The reverse: with only a profile of parked cores (``cores0-1``) on disk, asking for awake
    cores names the missing folder and the bench command; it never fits the parked rows."""
    import shutil

    if measured["first"].placement == "unpinned":
        pytest.skip("one core: the ranks were not pinned")
    root = tmp_path / "profiles"
    shutil.copytree(measured["root"], root)
    awake = next(root.rglob("gloo-w2-*-awake"))
    awake.rename(awake.with_name(awake.name.removesuffix("-awake")))
    with pytest.raises(CollectiveProfileError, match=re.escape(f"{awake.name} is missing")) as err:
        load_collective_model(world_size=2, backend="gloo", profile_root=root)
    assert "python -m costmodel.collectives bench world_size=2" in str(err.value)
    assert load_collective_model(world_size=2, backend="gloo", profile_root=root, keep_awake=False).world_size == 2


def test_a_profile_from_before_the_step_protocol_reads_as_warm_and_asks_for_a_bench(measured, tmp_path):
    """A measurements.csv without the protocol and mean columns: its rows are warm rows; the
    step model is refused with the command that measures it, never fitted on warm rows."""
    import shutil

    old = tmp_path / measured["root"].name
    shutil.copytree(measured["root"], old)
    csv = next(old.rglob("measurements.csv"))
    frame = pd.read_csv(csv)
    frame[frame["protocol"] == "warm"].drop(columns=["protocol", "mean_s", "max_over_ranks_mean_s"]).to_csv(
        csv, index=False)
    rows = CollectiveProfile.load(csv.parent).measurements()
    assert set(rows["protocol"]) == {"warm"} and rows["mean_s"].isna().all()
    assert load_collective_model(world_size=2, backend="gloo", profile_root=old).protocol == "warm"
    with pytest.raises(CollectiveProfileError, match=re.escape("holds no rows of the 'step' timing protocol")) as err:
        load_collective_model(world_size=2, backend="gloo", profile_root=old, protocol="step")
    assert f"python -m costmodel.collectives bench world_size=2 profile_root={old}" in str(err.value)
    from costmodel.collectives import load_step_model

    model, how = load_step_model(2, "gloo", old)  # a predict-only run: the warm rows, and says so
    assert model.protocol == "warm" and "no 'step' rows" in how
    assert load_step_model(2, "gloo", measured["root"])[0].protocol == "step"


def _spawned_children() -> list[psutil.Process]:
    return [c for c in psutil.Process().children(recursive=True) if c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE]


def test_a_rank_that_dies_stops_every_rank(tmp_path):
    before = {p.pid for p in _spawned_children()}
    with pytest.raises(EPWorkerError, match="rank 1 of world_size=2 exited with code 7 without a result"):
        bench_collectives(2, TINY, tmp_path, allow_oversubscribe=True, measure_lock=False, progress=False,
                          rank_fn=fail_mid_run)
    left = [p for p in _spawned_children() if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline())]
    assert left == []
    assert not list(tmp_path.rglob("measurements.csv"))


def test_cli_prints_one_clear_error(capsys, tmp_path):
    from costmodel.collectives.__main__ import main
    n = len(usable_cores())
    assert main(["bench", f"world_size={n + 1}", f"profile_root={tmp_path}"]) == 1
    assert f"error: world_size={n + 1} cannot be placed one rank per core" in capsys.readouterr().err
    assert main(["fit", f"profile_root={tmp_path}"]) == 1
    assert "python -m costmodel.collectives bench world_size=2" in capsys.readouterr().err


def test_an_all_digit_run_id_reads_back_as_text(tmp_path):
    """uuid4().hex[:12] is all digits about once in 290 runs; pandas would read such an id as an
    integer and a run's rows would no longer compare equal to its id."""
    from costmodel.collectives.store import COLUMNS, MEASUREMENTS, NUMERIC

    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "fingerprint.json").write_text("{}")
    row = {c: (1.0 if c in NUMERIC else "x") for c in COLUMNS} | {"run_id": "785858793609", "protocol": "warm"}
    pd.DataFrame([row]).to_csv(folder / MEASUREMENTS, index=False)
    assert CollectiveProfile.load(folder).measurements()["run_id"].tolist() == ["785858793609"]
