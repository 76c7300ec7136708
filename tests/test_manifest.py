"""scripts/manifest.py: one row per results/<machine>/<run>/ folder, from its files alone."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import manifest  # noqa: E402


def _summary(experiment: str, details: dict, l3: tuple[float, float, float]) -> dict:
    return {"experiment": experiment, "device": "Some CPU (cpu, 2 threads)", "n_points": 3,
            "median_ape_pct": {"L0": 90.0, "L3": l3[0]}, "p90_ape_pct": {"L0": 95.0, "L3": l3[1]},
            "max_ape_pct": {"L0": 99.0, "L3": l3[2]}, "details": details}


def _run(root: Path, machine: str, run: str, summary: dict, overrides: list[str] | None = None) -> Path:
    d = root / "results" / machine / run
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "results.csv").write_text("label,param,value,backend,measured_s,round_cv,rounds_timed,pred_L3_s\n"
                                   "loop,exponent,0.0,loop,0.01,0.05,3,0.011\n"
                                   "loop,exponent,1.0,loop,0.02,0.04,3,0.019\n")
    if overrides is not None:
        (d / ".hydra").mkdir()
        (d / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    return d


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_two_runs_give_two_rows_with_their_command_scoring_and_errors(tmp_path):
    _run(tmp_path, "cpu_epyc", "moe_a", _summary("moe_skew", {"model_profile": "cpu-x-t2-float32-abc",
                                                              "scoring": "held-out"}, (2.5, 8.0, 12.25)),
         overrides=["experiment=moe_skew", "moe.top_k=1", "progress=false"])
    _run(tmp_path, "cpu", "gnn_b", _summary("gnn_degree", {"paired": {"kernels": 53}}, (4.0, 9.0, 20.0)))
    (tmp_path / "README.md").write_text("![plot](results/cpu_epyc/moe_a/latency_vs_concentration.png)\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "method.md").write_text("files: `results/cpu_epyc/moe_a/`.\n")

    rows = manifest.write_manifest(tmp_path / "results", repo_root=tmp_path)
    on_disk = _read(tmp_path / "results" / "MANIFEST.csv")

    assert on_disk == rows
    assert list(on_disk[0]) == manifest.COLUMNS
    assert [(r["machine"], r["run"]) for r in on_disk] == [("cpu", "gnn_b"), ("cpu_epyc", "moe_a")]
    gnn, moe = on_disk
    assert moe["experiment"] == "moe_skew"
    assert moe["command"] == "python -m sim experiment=moe_skew moe.top_k=1"
    assert moe["profile_fingerprint"] == "cpu-x-t2-float32-abc"
    assert moe["scoring"] == "held-out"
    assert (moe["median_L3_ape_pct"], moe["p90_L3_ape_pct"], moe["max_L3_ape_pct"]) == ("2.50", "8.00", "12.25")
    assert moe["quoted"] == "(folder);latency_vs_concentration.png"
    assert moe["date"]  # not in git here: the newest file's mtime
    assert gnn["command"] == "python -m sim experiment=gnn_degree"  # no .hydra: from the summary
    assert gnn["scoring"] == "replay (pre-held-out)"
    assert gnn["profile_fingerprint"] == "Some CPU (cpu, 2 threads)"
    assert gnn["commit"] == "" and gnn["quoted"] == ""


def test_hand_filled_cells_survive_a_rerun_and_a_folder_without_summary_is_listed(tmp_path):
    run = _run(tmp_path, "cpu", "moe_a", _summary("moe_skew", {}, (3.0, 7.0, 9.0)),
               overrides=["experiment=moe_skew"])
    (tmp_path / "results" / "cpu" / "composition").mkdir()
    (tmp_path / "results" / "cpu" / "composition" / "console.txt").write_text("x\n")
    out = tmp_path / "results" / "MANIFEST.csv"
    rows = manifest.write_manifest(tmp_path / "results", repo_root=tmp_path)
    assert rows[0]["run"] == "composition" and rows[0]["scoring"] == "" and rows[0]["median_L3_ape_pct"] == ""
    assert rows[1]["scoring"] == "lookup"
    rows[0]["command"], rows[0]["experiment"] = "python scripts/bench_composition.py", "bench_composition"
    rows[1]["commit"] = "abc1234"
    manifest.write_csv(rows, out, manifest.COLUMNS)
    for f in (run / ".hydra").iterdir():  # the .hydra copies dropped: the command comes from the manifest
        f.unlink()
    (run / ".hydra").rmdir()

    again = manifest.write_manifest(tmp_path / "results", repo_root=tmp_path)
    assert again[0]["command"] == "python scripts/bench_composition.py"
    assert again[0]["experiment"] == "bench_composition"
    assert again[1]["commit"] == "abc1234"
    assert again[1]["command"] == "python -m sim experiment=moe_skew"


def test_a_runs_own_provenance_gives_commit_and_date_and_hand_context_is_kept(tmp_path):
    run_info = {"commit": "1234567", "dirty": True, "finished_at": "2026-12-05T09:09:00+00:00"}
    _run(tmp_path, "cpu", "moe_a", _summary("moe_skew", {"run": run_info, "scoring": "held-out"}, (3.0, 7.0, 9.0)),
         overrides=["experiment=moe_skew"])
    _run(tmp_path, "cpu", "old_b", _summary("gnn_degree", {"scoring": "held-out"}, (4.0, 8.0, 10.0)),
         overrides=["experiment=gnn_degree"])
    (tmp_path / "results" / "cpu" / "fit_report").mkdir()
    (tmp_path / "results" / "cpu" / "fit_report" / "fit_report.txt").write_text("x\n")
    first = manifest.write_manifest(tmp_path / "results", repo_root=tmp_path)
    assert [r["run"] for r in first] == ["fit_report", "moe_a", "old_b"]
    assert (first[1]["commit"], first[1]["date"]) == ("1234567-dirty", "2026-12-05T09:09:00+00:00")
    first[0].update(scoring="held-out (kernels)", median_L3_ape_pct="8.82", profile_fingerprint="cpu-x")
    first[1]["command"] = "make run (python -m sim experiment=moe_skew) in a fresh clone"
    first[1]["date"] = "2020-01-01T00:00:00+00:00"  # a stale hand edit: the run's own time wins
    first[2]["date"] = "2026-12-02T17:32:11+00:00"  # an older run's time, filled by hand: kept
    first[2]["command"] = "python -m sim experiment=mlp_batch (a different command)"
    manifest.write_csv(first, tmp_path / "results" / "MANIFEST.csv", manifest.COLUMNS)

    again = manifest.write_manifest(tmp_path / "results", repo_root=tmp_path)
    fit, moe, old = again
    assert (fit["scoring"], fit["median_L3_ape_pct"], fit["profile_fingerprint"]) == ("held-out (kernels)", "8.82", "cpu-x")
    assert moe["command"] == "make run (python -m sim experiment=moe_skew) in a fresh clone"
    assert moe["date"] == "2026-12-05T09:09:00+00:00"
    assert old["date"] == "2026-12-02T17:32:11+00:00"
    assert old["command"] == "python -m sim experiment=gnn_degree"  # the folder's overrides, not another command


def test_noise_floor_inputs_aggregate_and_explode_back(tmp_path):
    a = _run(tmp_path, "cpu", "moe_a", _summary("moe_skew", {}, (1.0, 2.0, 3.0)))
    b = _run(tmp_path, "cpu", "moe_b", _summary("moe_skew", {}, (1.0, 2.0, 3.0)))
    agg = tmp_path / "noise_floor_runs.csv"
    assert manifest.aggregate([a, b], agg) == 4
    rows = _read(agg)
    assert {r["run"] for r in rows} == {"moe_a", "moe_b"} and rows[0]["experiment"] == "moe_skew"
    assert rows[0]["pred_L3_s"] == "0.011" and rows[0]["measured_iqr_s"] == ""
    dirs = manifest.explode(agg, tmp_path / "back")
    assert sorted(d.name for d in dirs) == ["moe_a", "moe_b"]
    back = _read(tmp_path / "back" / "moe_a" / "results.csv")
    assert [r["measured_s"] for r in back] == ["0.01", "0.02"]
    # a column the run never had (empty in all its rows) is left out, not written as blanks
    assert "measured_iqr_s" not in back[0] and "round_cv" in back[0]
