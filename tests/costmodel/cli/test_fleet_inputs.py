"""`costmodel.cli.fleet`'s bad inputs (issue 28) and its layering, on tiny synthetic profiles
(30 GEMMs each: a fit takes well under a second): a corrupt or unloadable model bundle, an
unreadable folder, rich markup in a device name or a path, a dtype this code does not
know, ``--out`` naming a file; and that the fleet never imports ``sim``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.cli import fleet
from costmodel.families.gemm import GemmSpec
from costmodel.measure.device import Fingerprint
from costmodel.model.predictor import CostModel
from costmodel.store.model_cache import ModelCacheWarning
from costmodel.store.profile import DeviceProfile

ROOT = Path(__file__).resolve().parents[3]
FIELDS = dict(device_kind="cpu", device_name="Test CPU", torch_version="2.13.0+cpu", blas="mkl", threads=2,
              cuda_version="none", driver_version="none", dtype="float32", allocator="steady", cache="warm")


def gemm_workloads(dtype: str) -> dict[str, list[GemmSpec]]:
    """Two workloads of GEMMs only (what a synthetic GEMM profile predicts), in ``dtype``."""
    return {"gemm 64": [GemmSpec(64, 64, 64, dtype)], "gemm 256 twice": [GemmSpec(256, 64, 64, dtype)] * 2}


@pytest.fixture
def make(fill_gemms):
    """``make(root, **fingerprint fields)``: a profile of 30 synthetic GEMMs in its own folder."""

    def make(root: Path, **changes) -> DeviceProfile:
        fp = Fingerprint(**{**FIELDS, **changes})
        profile = DeviceProfile.open(root, fp)
        fill_gemms(profile, 30)
        return profile

    return make


def _no_sim_after(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, then print the sim modules it imported."""
    script = code + "\nimport sys\nprint('SIM:', sorted(m for m in sys.modules if m == 'sim' or m.startswith('sim.')))\n"
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120, env=_env())


def _env() -> dict[str, str]:
    """A subprocess's environment: this checkout, this session's model cache, and HOME (so
    matplotlib keeps its font cache)."""
    keep = {k: os.environ[k] for k in ("PATH", "HOME", "MPLCONFIGDIR") if k in os.environ}
    return {**keep, "PYTHONPATH": str(ROOT), "MOEGNN_MODEL_CACHE": os.environ["MOEGNN_MODEL_CACHE"]}


# ----------------------------------------------------------------------------- layering


def test_importing_the_fleet_imports_no_sim(tmp_path):
    done = _no_sim_after("import costmodel.cli.fleet", tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "SIM: []"


def test_a_whole_fleet_run_imports_no_sim(make, tmp_path, monkeypatch):
    """Loading, fitting, predicting, tables and plot: sim depends on costmodel, never the
    reverse. In this process (fast): every sim module is hidden (``sys.modules[name] = None``
    makes any import of it raise ImportError) for the run."""
    for name in [m for m in sys.modules if m == "sim" or m.startswith("sim.")] + ["sim"]:
        monkeypatch.setitem(sys.modules, name, None)
    make(tmp_path / "root")
    report = fleet.run(tmp_path / "root", tmp_path / "out", workloads_for=gemm_workloads)
    assert report["predictions"]["L3_s"].notna().all()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "fleet.png", "fleet_ceilings.csv", "fleet_efficiency.csv", "fleet_predictions.csv"]


def test_trace_seconds_is_the_simulators_sum_on_a_cold_profile(make, tmp_path):
    """fleet's own per-trace sum (no sim import) equals sim.predict.simulator.predict_trace's,
    one cold start per kernel kind included at L3 and not at L0."""
    from sim.predict.simulator import predict_trace

    profile = make(tmp_path / "root", cache="cold")
    profile.write_ceilings({**json.loads((profile.path / "ceilings.json").read_text()), "cold_call_overhead_s": 3e-6})
    model = CostModel.load(profile)
    trace = gemm_workloads("float32")["gemm 256 twice"] + [GemmSpec(8, 64, 64)]
    for level in ("L0", "L3"):
        assert fleet.trace_seconds(model, trace, level) == pytest.approx(
            float(predict_trace(model, trace, [level], quiet=True)[level].sum()), rel=1e-12)
    bare = float(model.predict(trace, ["L3"])["L3"].sum())
    assert fleet.trace_seconds(model, trace, "L3") == pytest.approx(bare + 3e-6, rel=1e-9)  # GEMMs: one kind


# ----------------------------------------------------------------------------- bad inputs


def test_an_unknown_dtype_skips_that_profile_before_fitting(make, tmp_path, monkeypatch, capsys):
    good = make(tmp_path / "root")
    bad = make(tmp_path / "root", dtype="int4")
    fitted = []
    load = CostModel.load.__func__
    monkeypatch.setattr(CostModel, "load", classmethod(lambda cls, p, **kw: fitted.append(p.path) or load(cls, p, **kw)))
    report = fleet.run(tmp_path / "root", tmp_path / "out", workloads_for=gemm_workloads)
    reason = (f"ProfileError: {bad.path / 'fingerprint.json'}: dtype must be one of "
              "['float64', 'float32', 'bfloat16', 'float16'], got 'int4'")
    assert report["skipped"].values.tolist() == [[bad.path, reason]]
    assert fitted == [good.path]
    assert list(report["ceilings"]["profile"]) == [good.path.name]
    assert f"warning: skipping profile {bad.path}: " in " ".join(capsys.readouterr().out.split())


def test_an_unknown_cache_mode_skips_that_profile(make, tmp_path):
    make(tmp_path / "root")
    bad = make(tmp_path / "root", cache="tepid")
    devices, skipped = fleet.load_fleet(tmp_path / "root")
    assert len(devices) == 1
    assert skipped == [(bad.path, f"ProfileError: {bad.path / 'fingerprint.json'}: cache must be one of "
                                  "['warm', 'cold'], got 'tepid'")]


def test_markup_in_a_device_name_and_a_path_is_printed_as_it_is(make, tmp_path, capsys):
    name = "Lab [/] box [bold]x[/bold] [red"
    make(tmp_path / "root", device_name=name)
    broken = tmp_path / "root" / "lab [/]" / "cpu-broken"
    broken.mkdir(parents=True)
    (broken / "fingerprint.json").write_text("{not json", encoding="utf-8")
    report = fleet.run(tmp_path / "root", tmp_path / "out", workloads_for=gemm_workloads)
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert list(report["ceilings"]["device"]) == [f"{name} t2 float32 warm"]
    assert f"{name} t2 float32 warm" in out  # the tags shown, not taken as markup
    assert f"warning: skipping profile {broken}: ProfileError: {broken / 'fingerprint.json'} is corrupted" in out
    assert f"1 profile(s) or folder(s) skipped: {broken}" in out
    assert (tmp_path / "out" / "fleet.png").stat().st_size > 0


def test_an_unreadable_folder_is_named_and_the_rest_kept(make, tmp_path, monkeypatch, capsys):
    """chmod 000 on a folder (simulated: this may run as root, who reads it anyway)."""
    good = make(tmp_path / "root")
    locked = tmp_path / "root" / "lab-b"
    make(locked)
    real = os.scandir

    def scandir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    devices, skipped = fleet.load_fleet(tmp_path / "root")
    reason = "cannot list this folder (Permission denied): any profile in it is left out"
    assert [d.path for d in devices] == [good.path]
    assert skipped == [(locked, reason)]
    assert f"warning: skipping folder {locked}: {reason}" in " ".join(capsys.readouterr().out.split())


def test_an_unreadable_root_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "root").mkdir()
    monkeypatch.setattr(os, "scandir", lambda path=".": (_ for _ in ()).throw(PermissionError(13, "Permission denied",
                                                                                             str(path))))
    with pytest.raises(fleet.FleetError, match=r"^profile root .*root cannot be read: cannot list this folder "
                                               r"\(Permission denied\)"):
        fleet.load_fleet(tmp_path / "root")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads a chmod 000 folder anyway")
def test_a_chmod_000_folder_is_named(make, tmp_path):
    make(tmp_path / "root")
    locked = tmp_path / "root" / "lab-b"
    make(locked)
    locked.chmod(0)
    try:
        devices, skipped = fleet.load_fleet(tmp_path / "root")
    finally:
        locked.chmod(0o755)
    assert len(devices) == 1 and [p for p, _ in skipped] == [locked]


def test_random_bytes_in_a_profiles_models_joblib_are_ignored_and_named(make, tmp_path, capsys):
    profile = make(tmp_path / "root")
    (profile.path / "models.joblib").write_bytes(bytes(range(256)) * 4)
    with pytest.warns(ModelCacheWarning, match=f"ignoring {profile.path / 'models.joblib'}: fitted models are never "
                                               "loaded from a profile folder"):
        report = fleet.run(tmp_path / "root", tmp_path / "out", workloads_for=gemm_workloads)
    assert report["skipped"].empty
    assert report["predictions"]["L3_s"].notna().all()


def test_a_corrupt_model_cache_entry_is_named_and_refitted(make, tmp_path, monkeypatch):
    monkeypatch.setenv("MOEGNN_MODEL_CACHE", str(tmp_path / "cache"))
    profile = make(tmp_path / "root")
    entry = CostModel.load(profile).save(profile)
    entry.write_bytes(bytes(range(256)) * 4)
    with pytest.warns(ModelCacheWarning, match=f"model cache entry {entry} cannot be read \\(.*\\); refitting"):
        devices, skipped = fleet.load_fleet(tmp_path / "root")
    assert not skipped and devices[0].model is not None and devices[0].model.origin == "fitted"


def test_models_that_cannot_be_loaded_leave_the_profile_without_l3(make, tmp_path, monkeypatch, capsys):
    """Whatever a model bundle raises (the old `KeyError: 62`), that profile keeps its
    ceilings and efficiency, says why it has no L3, and the others are predicted."""
    good = make(tmp_path / "root")
    bad = make(tmp_path / "root", device_name="Other CPU")
    load = CostModel.load.__func__

    def broken(cls, profile, **kw):
        if profile.path == bad.path:
            raise KeyError(62)
        return load(cls, profile, **kw)

    monkeypatch.setattr(CostModel, "load", classmethod(broken))
    report = fleet.run(tmp_path / "root", tmp_path / "out", workloads_for=gemm_workloads)
    assert report["skipped"].empty
    ceil = report["ceilings"].set_index("profile")
    assert ceil.loc[bad.path.name, "notes"] == "no L3: its cost models cannot be read or fitted (KeyError: 62)"
    pred = report["predictions"]
    labels = ceil["device"].to_dict()
    assert pred[pred["device"] == labels[bad.path.name]]["note"].tolist() == ["no fitted model"] * 2
    assert pred[pred["device"] == labels[good.path.name]]["L3_s"].notna().all()
    out = " ".join(capsys.readouterr().out.split())
    assert (f"warning: profile {bad.path}: its cost models cannot be read or fitted (KeyError: 62); shown without L3"
            in out)


@pytest.mark.parametrize("make_out, message", [
    (lambda p: p.write_text("x"), "--out {out} is an existing file, not a folder: name a folder (created if missing)"),
    (lambda p: p.parent.write_text("x"), None),
])
def test_out_naming_a_file_is_refused_before_loading(make_out, message, make, tmp_path, monkeypatch):
    make(tmp_path / "root")
    out = tmp_path / "out" if message else tmp_path / "file" / "out"
    make_out(out)
    monkeypatch.setattr(CostModel, "load", classmethod(lambda *a, **k: pytest.fail("loaded before --out was checked")))
    expected = message.format(out=out) if message else (f"--out {out}: {tmp_path / 'file'} is a file, so no folder "
                                                        "can be made below it; name another folder")
    with pytest.raises(fleet.FleetError) as err:
        fleet.run(tmp_path / "root", out, workloads_for=gemm_workloads)
    assert str(err.value) == expected


def test_the_command_says_out_is_a_file_in_one_line(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "taken").write_text("x")
    done = subprocess.run([sys.executable, "-m", "costmodel", "fleet", "root", "--out", "taken"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2
    assert done.stderr == "error: --out taken is an existing file, not a folder: name a folder (created if missing)\n"


def test_workloads_for_must_be_callable(make, tmp_path):
    make(tmp_path / "root")
    with pytest.raises(TypeError, match=r"^workloads_for must be a callable dtype -> \{name: trace\}, got dict$"):
        fleet.run(tmp_path / "root", tmp_path / "out", workloads_for={})
