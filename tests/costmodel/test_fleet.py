"""`python -m costmodel fleet`: the committed profiles side by side, and its bad inputs
(an empty root, a corrupt profile among good ones)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel import fleet

ROOT = Path(__file__).resolve().parents[2]
COLD = "cpu-intel-r-xeon-r-processor-t2-float32-2862a8a0be"  # every family
WARM = "cpu-intel-r-xeon-r-processor-t2-float32-b3d5410f1a"  # gemm and elementwise only


def _fleet(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "costmodel", "fleet", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture(scope="module")
def fleet_root(tmp_path_factory):
    """Copies of the two committed profiles (read-only originals) plus a corrupt third one
    nested a level deeper, as another machine's bench might leave it."""
    root = tmp_path_factory.mktemp("fleet")
    for name in (COLD, WARM):
        shutil.copytree(ROOT / "profiles" / name, root / name)
    broken = root / "lab-b" / "cpu-broken"
    shutil.copytree(ROOT / "profiles" / WARM, broken)
    (broken / "measurements.csv").write_text('key,round\n"unterminated,0\n', encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def report(fleet_root, tmp_path_factory):
    return fleet.run(fleet_root, tmp_path_factory.mktemp("fleet_out"))


def test_a_corrupt_profile_is_skipped_and_the_rest_kept(report, fleet_root):
    assert list(report["skipped"]["path"]) == [fleet_root / "lab-b" / "cpu-broken"]
    assert "measurements.csv" in report["skipped"]["reason"].iloc[0]
    assert set(report["ceilings"]["profile"]) == {COLD, WARM}


def test_ceilings_and_ridge_come_from_each_profile(report):
    ceil = report["ceilings"].set_index("profile")
    assert ceil.loc[COLD, "cache"] == "cold" and ceil.loc[WARM, "cache"] == "warm"
    for _, row in ceil.iterrows():
        assert row["ridge_flops_per_byte"] == pytest.approx(row["peak_gflops"] / row["bandwidth_gb_s"])
    assert ceil.loc[COLD, "peak_gflops"] != ceil.loc[WARM, "peak_gflops"]


def test_efficiency_covers_each_profiles_own_families(report):
    eff = report["efficiency"]
    label = dict(zip(report["ceilings"]["profile"], report["ceilings"]["device"]))
    assert set(eff[eff["device"] == label[WARM]]["family"]) == {"gemm", "elementwise"}
    assert {"gather", "scatter", "grouped_gemm"} <= set(eff[eff["device"] == label[COLD]]["family"])
    gather = eff[(eff["device"] == label[COLD]) & (eff["family"] == "gather")].iloc[0]
    assert gather["ceiling"] == "bandwidth" and gather["unit"] == "GB/s"  # byte-bound family, judged by bandwidth
    assert (eff["median_pct_of_ceiling"] > 0).all()


def test_the_same_workloads_are_predicted_and_ranked_on_every_device(report):
    pred = report["predictions"]
    assert pred.groupby("device")["workload"].nunique().tolist() == [5, 5]
    assert pred["L0_s"].notna().all() and (pred["rank_L0"] >= 1).all()
    label = dict(zip(report["ceilings"]["profile"], report["ceilings"]["device"]))
    cold = pred[pred["device"] == label[COLD]]
    assert cold["L3_s"].notna().all()
    assert (cold["L3_s"] > cold["L0_s"]).all()  # FLOPs / peak is a lower bound here
    moe = cold.set_index("workload")["L3_s"]
    assert moe["moe_skew zipf 8"] < moe["moe_skew zipf 0"]  # the loop reads fewer experts' weights
    warm = pred[pred["device"] == label[WARM]].set_index("workload")
    assert warm.loc["dense MLP B256", "L3_s"] > 0  # gemm + elementwise: predictable
    assert pd_isna(warm.loc["gnn_degree rmat 0.57", "L3_s"]) and "without families" in warm.loc["gnn_degree rmat 0.57", "note"]


def pd_isna(v) -> bool:
    return v != v


def test_the_command_writes_tables_and_a_plot(fleet_root, tmp_path):
    done = _fleet(str(fleet_root), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipping profile" in done.stdout and "cpu-broken" in done.stdout
    for name in ("fleet_ceilings.csv", "fleet_efficiency.csv", "fleet_predictions.csv", "fleet.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


@pytest.mark.parametrize("make, message", [
    (lambda p: p.mkdir(), "no device profiles under"),
    (lambda p: None, "does not exist"),
])
def test_an_empty_or_missing_root_is_a_clear_error(make, message, tmp_path):
    root = tmp_path / "root"
    make(root)
    with pytest.raises(fleet.FleetError, match=message):
        fleet.load_fleet(root)
    done = _fleet(str(root), cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr


def test_a_root_of_only_corrupt_profiles_is_an_error(tmp_path):
    bad = tmp_path / "root" / "cpu-x"
    bad.mkdir(parents=True)
    (bad / "fingerprint.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(fleet.FleetError, match="all 1 were skipped"):
        fleet.load_fleet(tmp_path / "root")


def test_models_saved_by_another_code_version_are_refitted_in_memory(tmp_path):
    """A profile whose saved models another version of the code fitted (other features):
    fleet refits them in memory, says so, and leaves the files as they were."""
    import json

    dst = tmp_path / WARM
    shutil.copytree(ROOT / "profiles" / WARM, dst)
    meta_file = dst / "models.json"
    meta = json.loads(meta_file.read_text())
    meta["model_version"] = int(meta["model_version"]) - 1
    meta_file.write_text(json.dumps(meta))
    before = (dst / "models.joblib").read_bytes()
    device = fleet.load_device(dst)
    assert device.model is not None
    assert any("older version of this code" in n and "not saved" in n for n in device.notes)
    assert (dst / "models.joblib").read_bytes() == before
