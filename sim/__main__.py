"""`python -m sim experiment=NAME [overrides]`: run one experiment (``-m`` for sweeps).

conf/experiment/NAME.yaml selects experiments/NAME.py, whose ``run(cfg)`` does the work
and is testable without this entry point. ``python -m sim -m 'experiment=glob(*)'`` runs
every experiment.

Bad input (a ValueError naming the field) prints one line and exits with status 2
(``costmodel.cli_errors``); in a ``-m`` sweep every job's config is validated before the
first job runs (``costmodel.sweep_check``, a Hydra callback in conf/config.yaml).
An experiment module says whether it measures (``MEASURES``: "always", the default;
"optional": ``measure=false`` predicts only; "never"). A job that measures refuses to run
beside other jobs on one machine (``costmodel.launchers``); ``measure=false`` on an
experiment that always measures is refused, not ignored.
"""

from __future__ import annotations

import importlib
import sys

import hydra
from omegaconf import DictConfig

from costmodel.cli_errors import report_user_errors

from costmodel.launchers import missing_plugin_message, refuse_parallel_measuring

PREDICT_ONLY_EXPERIMENTS = ("moe_design", "moe_skew", "gnn_degree")


def measures(module: object, cfg: DictConfig) -> bool:
    """Whether this job times anything on this machine."""
    kind = getattr(module, "MEASURES", "always")
    if kind == "optional":
        return bool(cfg.get("measure", True))
    if kind == "always" and cfg.get("measure", True) is False:
        raise ValueError(f"experiment={cfg.name} always measures; measure=false (predict only) is supported by "
                         f"{', '.join(PREDICT_ONLY_EXPERIMENTS)}")
    return kind == "always"


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@report_user_errors
def main(cfg: DictConfig) -> None:
    module = importlib.import_module(f"experiments.{cfg.name}")
    if measures(module, cfg):
        refuse_parallel_measuring(f"experiment={cfg.name}")
    module.run(cfg)


if __name__ == "__main__":
    message = missing_plugin_message(sys.argv[1:])
    if message:
        sys.exit(f"error: {message}")
    main()
