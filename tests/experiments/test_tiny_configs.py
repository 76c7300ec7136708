"""The tiny forms (conf/tiny/NAME.yaml): one per experiment, only keys the experiment has, and
the same files for the tests and for scripts/gpu_check.sh's CPU dry run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
MISSING = object()


def _leaf_paths(node: DictConfig, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        out += _leaf_paths(value, path + ".") if isinstance(value, DictConfig) else [path]
    return out


def _compose(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides))


def test_every_experiment_has_exactly_one_tiny_form():
    assert sorted(p.stem for p in (CONF / "tiny").glob("*.yaml")) == EXPERIMENTS


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_a_tiny_form_only_shrinks_keys_its_experiment_has(name):
    """A config file, unlike a command-line override, may add a key nobody reads: a typo
    would leave the experiment at full size. Every key set must exist already."""
    tiny = OmegaConf.load(CONF / "tiny" / f"{name}.yaml")
    base, small = _compose(f"experiment={name}"), _compose(f"experiment={name}", f"+tiny={name}")
    settings = _leaf_paths(OmegaConf.masked_copy(tiny, [k for k in tiny if k != "defaults"]))
    unknown = [p for p in settings if OmegaConf.select(base, p, default=MISSING) is MISSING]
    assert not unknown, f"conf/tiny/{name}.yaml sets keys experiment={name} does not have: {unknown}"
    assert all(OmegaConf.select(small, p) == OmegaConf.select(tiny, p) for p in settings)
    if settings or "defaults" in tiny:
        assert OmegaConf.to_yaml(small) != OmegaConf.to_yaml(base)


def test_gpu_check_dry_run_selects_the_same_tiny_forms():
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    start = script.index("  declare -A SIZES=()\n  for tiny in conf/tiny/")
    block = script[start:script.index("  done\n", start) + len("  done\n")]
    shown = subprocess.run(["bash", "-c", block + 'for k in "${!SIZES[@]}"; do echo "$k=${SIZES[$k]}"; done'],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert sorted(shown) == [f"{name}=+tiny={name}" for name in EXPERIMENTS]
