"""`python -m costmodel fleet`: the committed profiles side by side, and its bad inputs
(an empty root, a corrupt profile among good ones)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.cli import fleet

ROOT = Path(__file__).resolve().parents[3]
COLD = "cpu-intel-r-xeon-r-processor-t2-float32-2862a8a0be"  # every family
WARM = "cpu-intel-r-xeon-r-processor-t2-float32-b3d5410f1a"  # gemm and elementwise only


def _fleet(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLUMNS": "200",
           "MOEGNN_MODEL_CACHE": os.environ["MOEGNN_MODEL_CACHE"]}
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
    from sim.workloads.reference import reference_workloads

    return fleet.run(fleet_root, tmp_path_factory.mktemp("fleet_out"), workloads_for=reference_workloads)


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


class _Planted:
    """Unpickling it calls ``open(marker, "w")``: proof that a pickle was loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_in_a_profile_folder_is_never_loaded(tmp_path):
    """A models.joblib in a profile (older code saved one there; anyone who can write a shared
    root can plant one) is ignored, with its models.json: the fleet's models come from this
    user's cache, fitted from the measurements, and the profile is left as it was."""
    import json

    import joblib

    from costmodel.store.model_cache import ModelCacheWarning
    from costmodel.model.predictor import MODEL_VERSION
    from costmodel.store.profile import DeviceProfile

    dst = tmp_path / "root" / WARM
    shutil.copytree(ROOT / "profiles" / WARM, dst)
    marker = tmp_path / "pwned"
    joblib.dump({"levels": _Planted(marker), "ceilings": {}, "measured_s": {}}, dst / "models.joblib")
    profile = DeviceProfile.load(dst)
    (dst / "models.json").write_text(json.dumps({"profile_hash": profile.content_hash(), "model_version": MODEL_VERSION,
                                                 "fingerprint": profile.fingerprint.to_dict()}))
    before = (dst / "models.joblib").read_bytes()
    with pytest.warns(ModelCacheWarning, match="ignoring"):
        devices, skipped = fleet.load_fleet(tmp_path / "root")
    assert not skipped and devices[0].model is not None and devices[0].model.levels
    assert not marker.exists()
    assert (dst / "models.joblib").read_bytes() == before
    done = _fleet(str(tmp_path / "root"), "--out", str(tmp_path / "out"), cwd=tmp_path)  # the command, too
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ignoring" in done.stderr and not marker.exists()
