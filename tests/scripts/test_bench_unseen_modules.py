"""scripts/bench_unseen_modules.py: option checks, module builders, scores (nothing timed)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from script_loader import loaded_script
import torch

#: smaller than --tiny: the builders' wiring, not their speed
MOE = dict(tokens=8, hidden=32, intermediate=32, experts=8, top_k=2)


@pytest.fixture(scope="module")
def bench():
    yield from loaded_script("bench_unseen_modules")


@pytest.fixture
def profiles(tmp_path):
    root = tmp_path / "profiles"
    root.mkdir()
    return root


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be an integer >= 1, got 0"),
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--modules", "olmoe,mixtral"], r"--modules: unknown module\(s\) \['mixtral'\]; choose among"),
    (["--modules", ""], "--modules: unknown module"),
    (["--modules", "gat,gat"], r"--modules lists \['gat'\] more than once"),
    (["--graph", "grid"], "--graph must be one of"),
    (["--measure-lock", "maybe"], "--measure-lock must be one of"),
    (["--device", "tpu"], "--device must be cpu, cuda"),
    (["--rounds", "two"], "--rounds: invalid int value"),
])
def test_bad_options_stop_with_one_line_naming_the_option(bench, profiles, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args([*argv, "--profile-root", str(profiles)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("bench_unseen_modules.py: error: ")
    assert re.search(message, err), err


def test_profile_root_and_out_must_be_folders(bench, profiles, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--profile-root", str(tmp_path / "missing")])
    assert "--profile-root" in capsys.readouterr().err
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(SystemExit):
        bench.parse_args(["--profile-root", str(profiles), "--out", str(a_file / "run")])
    assert f"--out {a_file / 'run'} must be a folder" in capsys.readouterr().err


def test_defaults_tiny_and_module_subsets(bench, profiles):
    full = bench.parse_args(["--profile-root", str(profiles)])
    assert full.modules == [*bench.MOE_CASES, *bench.GNN_CASES]
    assert len(bench.MOE_CASES) >= 4 and len(bench.GNN_CASES) >= 4
    tiny = bench.parse_args(["--tiny", "--profile-root", str(profiles)])
    assert tiny.modules == list(bench.TINY_MODULES)
    assert sum(m in bench.MOE_CASES for m in tiny.modules) == 2 and sum(m in bench.GNN_CASES for m in tiny.modules) == 2
    some = bench.parse_args(["--tiny", "--modules", " gin , phimoe", "--profile-root", str(profiles)])
    assert some.modules == ["gin", "phimoe"]


def test_runtime_config_is_base_yaml_with_the_options(bench, profiles):
    from costmodel.measure.runtime import check_cfg

    tiny = bench.runtime_cfg(bench.parse_args(["--tiny", "--device", "cpu", "--profile-root", str(profiles)]))
    assert tiny["timing"]["rounds"] == 1 and tiny["timing"]["extra_rounds"] == 0
    assert tiny["profile"]["root"] == str(profiles.absolute()) and tiny["device"] == "cpu"
    check_cfg(tiny)
    full = bench.runtime_cfg(bench.parse_args(["--rounds", "5", "--measure-lock", "off", "--profile-root", str(profiles)]))
    assert full["timing"]["rounds"] == 5 and full["measure_lock"]["mode"] == "off"
    assert "extra_rounds" in full["timing"] and full["timing"]["extra_rounds"] > 0  # conf/base.yaml's, untouched


# ----------------------------------------------------------------------------- builders


@pytest.mark.parametrize("name", ["olmoe", "qwen3_moe", "deepseek_v3", "granitemoe", "phimoe", "jetmoe"])
def test_every_moe_block_builds_and_runs_deterministically(bench, name):
    pytest.importorskip("transformers")
    size = bench.MoESize(**MOE)
    block, (x,) = bench.build_moe(bench.MOE_CASES[name], size, seed=3)
    assert not block.training and x.shape == (1, MOE["tokens"], MOE["hidden"])
    with torch.no_grad():
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
        again, (x2,) = bench.build_moe(bench.MOE_CASES[name], size, seed=3)
        out2 = again(x2)
        out2 = out2[0] if isinstance(out2, tuple) else out2
    assert out.shape == x.shape and torch.isfinite(out).all()
    assert torch.equal(out, out2)  # seeded weights and input: the same routing, the same output


@pytest.mark.parametrize("name", ["gat", "gatv2", "gin", "graphconv", "transformer", "edgeconv", "resgated", "cheb"])
def test_every_conv_builds_and_runs_on_a_project_graph(bench, name):
    pytest.importorskip("torch_geometric")
    size = bench.GraphSize(nodes=64, edges=256, features=8)
    edge_index = bench.build_graph("rmat", size, seed=0)
    assert edge_index.shape == (2, 256)
    rng_before = torch.random.get_rng_state()
    conv, (x, ei) = bench.build_conv(name, size, edge_index, seed=1)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # the caller's RNG stream is left alone
    with torch.no_grad():
        out = conv(x, ei)
        again, (x2, _) = bench.build_conv(name, size, edge_index, seed=1)
        out2 = again(x2, ei)
    assert out.shape == (64, 8) and torch.isfinite(out).all()
    assert torch.equal(out, out2)


def test_training_step_call_gives_grads(bench):
    pytest.importorskip("torch_geometric")
    size = bench.GraphSize(nodes=32, edges=128, features=8)
    conv, inputs = bench.build_conv("graphconv", size, bench.build_graph("chung_lu", size, seed=0), seed=0)
    bench._step(conv, inputs)()
    assert all(p.grad is not None for p in conv.parameters())
    assert bench._forward(conv, inputs)().requires_grad is False


# ----------------------------------------------------------------------------- held out and scores


class _Profile:
    path = Path("/nowhere/profile")

    def kernels(self, **kwargs):
        self.kwargs = kwargs
        return pd.DataFrame({"family": ["gemm", "spmm", "scatter"], "key": ["a", "b", "c"]})


def test_family_view_keeps_only_the_modules_families(bench):
    profile = _Profile()
    view = bench.FamilyView(profile, {"gemm", "scatter"})
    table = view.kernels(ignore_refresh_policies=("paired",))
    assert list(table["family"]) == ["gemm", "scatter"] and list(table.index) == [0, 1]
    assert profile.kwargs == {"ignore_refresh_policies": ("paired",)} and view.path == profile.path


def _scored(measured, l2, l3, drift=None):
    df = pd.DataFrame({"measured_s": measured, "pred_heldout_L3_s": l3, "pred_heldout_drift_L3_s": drift or l3})
    for prefix in ("heldout", "lookup"):
        df[f"ape_{prefix}_L2_pct"] = [100 * abs(p - m) / m for p, m in zip(l2, measured)]
        df[f"ape_{prefix}_L3_pct"] = [100 * abs(p - m) / m for p, m in zip(l3, measured)]
    df["ape_heldout_drift_L3_pct"] = [100 * abs(p - m) / m for p, m in zip(drift or l3, measured)]
    df["heldout_L3_over_measured"] = df["pred_heldout_L3_s"] / df["measured_s"]
    return df


def test_scores_report_median_p90_max_and_the_target(bench):
    s = bench.scores(_scored([1.0, 1.0, 1.0], l2=[0.5, 0.6, 0.7], l3=[1.05, 1.10, 0.80]))
    assert s["points"] == 3
    assert s["heldout"]["L3"]["median"] == pytest.approx(10.0)
    assert s["heldout"]["L3"]["max"] == pytest.approx(20.0)
    assert s["heldout"]["L2"]["median"] == pytest.approx(40.0)
    assert s["heldout"]["L3"]["p90"] == pytest.approx(18.0)
    assert s["heldout"]["l3_beats_l2_at_median"] is True and s["heldout"]["meets_target"] is True
    assert "held-out" in s["heldout"]["what"] and "lookup" in s["lookup"]["what"]
    worse = bench.scores(_scored([1.0, 1.0], l2=[1.05, 0.95], l3=[1.2, 0.8]))
    assert worse["heldout"]["l3_beats_l2_at_median"] is False and worse["heldout"]["meets_target"] is False


def test_trace_kinds_counts_each_kind_once_and_each_unmapped_op_as_a_kind(bench):
    from types import SimpleNamespace

    from costmodel.families.elementwise import ElementwiseSpec
    from costmodel.families.gemm import GemmSpec

    def op(spec=None, aten="aten.mm.default"):
        return SimpleNamespace(kind="kernel" if spec is not None else "unmapped", spec=spec, aten_op=aten)

    ops = [op(GemmSpec(4, 8, 8)), op(GemmSpec(16, 8, 8)), op(ElementwiseSpec("mul", 8)), op(ElementwiseSpec("add", 8)),
           op(aten="aten._fft_r2c.default"), op(aten="aten._fft_r2c.default"), op(aten="aten.index_put_.default")]
    assert bench.trace_kinds(SimpleNamespace(predicted_ops=lambda: ops)) == 3 + 2
