"""`python -m sim experiment=NAME [overrides]`: run one experiment (``-m`` for sweeps).

conf/experiment/NAME.yaml selects experiments/NAME.py, whose ``run(cfg)`` does the work
and is testable without this entry point. ``python -m sim -m 'experiment=glob(*)'`` runs
every experiment.
"""

from __future__ import annotations

import importlib

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    module = importlib.import_module(f"experiments.{cfg.name}")
    module.run(cfg)


if __name__ == "__main__":
    main()
