"""`python -m sim experiment=NAME [overrides]`: run one experiment (``-m`` for sweeps).

conf/experiment/NAME.yaml selects experiments/NAME.py, whose ``run(cfg)`` does the work
and is testable without this entry point. ``python -m sim -m 'experiment=glob(*)'`` runs
every experiment.

Bad input (a ValueError naming the field) prints one line and exits with status 2
(``costmodel.cli_errors``); in a ``-m`` sweep every job's config is validated before the
first job runs (``costmodel.sweep_check``, a Hydra callback in conf/config.yaml).
"""

from __future__ import annotations

import importlib

import hydra
from omegaconf import DictConfig

from costmodel.cli_errors import report_user_errors


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@report_user_errors
def main(cfg: DictConfig) -> None:
    module = importlib.import_module(f"experiments.{cfg.name}")
    module.run(cfg)


if __name__ == "__main__":
    main()
