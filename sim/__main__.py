"""`python -m sim experiment=NAME [overrides]`: run one experiment (``-m`` for sweeps).

conf/experiment/NAME.yaml selects experiments/NAME.py. The config is checked once, here:
the module's ``validate(cfg)`` checks it against the schema (``costmodel.cli.config_schema``:
conf/base.yaml's keys, ``experiments.common.COMMON_CONSTRAINTS`` and the module's
``CONSTRAINTS``) and returns the plan it derives (layer configs, generators), which
``run(cfg, plan=plan)`` gets; ``run(cfg)`` called from Python validates first, so it is
testable without this entry point. ``python -m sim -m 'experiment=glob(*)'`` runs
every experiment.

Bad input (a ValueError naming the field) prints one line and exits with status 2
(``costmodel.cli.errors``); in a ``-m`` sweep every job's config is validated before the
first job runs (``costmodel.cli.sweep_check``, a Hydra callback in conf/config.yaml).
An experiment module says whether it measures (``MEASURES``: "always", the default;
"optional": ``measure=false`` predicts only; "never"). A job that measures refuses to run
beside other jobs on one machine (``costmodel.cli.launchers``); ``measure=false`` on an
experiment that always measures is refused, not ignored. A measuring experiment holds the
machine-wide measuring lock (``costmodel.store.locks``, ``measure_lock.mode``) for its whole run:
exit 75 when it refuses, 130 after Ctrl-C (measured kernels are kept).
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from costmodel.cli.errors import report_user_errors
from costmodel.cli.launchers import missing_plugin_message, refuse_parallel_measuring

CONF_EXPERIMENTS = Path(__file__).resolve().parents[1] / "conf" / "experiment"


def predict_only_experiments() -> list[str]:
    """The experiments whose module says ``MEASURES = "optional"`` (``measure=false`` predicts
    only), read from the modules themselves, so a new experiment needs no list edit here."""
    names = sorted(p.stem for p in CONF_EXPERIMENTS.glob("*.yaml"))
    return [n for n in names if getattr(importlib.import_module(f"experiments.{n}"), "MEASURES", "always") == "optional"]


def measures(module: object, cfg: DictConfig) -> bool:
    """Whether this job times anything on this machine."""
    kind = getattr(module, "MEASURES", "always")
    if kind == "optional":
        return bool(cfg.get("measure", True))
    if kind == "always" and cfg.get("measure", True) is False:
        raise ValueError(f"experiment={cfg.name} always measures; measure=false (predict only) is supported by "
                         f"{', '.join(predict_only_experiments())}")
    return kind == "always"


def job_measures(cfg: DictConfig) -> bool:
    """Whether one job of a ``python -m sim`` sweep (its composed config) times anything on
    this machine (the ``measures`` of conf/config.yaml's sweep check,
    ``costmodel.cli.sweep_check.ValidateSweep``): as ``measures`` says for
    ``experiments.<name>``, which also refuses measure=false on an experiment that always
    measures (a ``ValueError``). A config without an experiment ``name`` is a bench job."""
    name = cfg.get("name")
    if name is None:
        return True
    return measures(importlib.import_module(f"experiments.{name}"), cfg)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@report_user_errors
def main(cfg: DictConfig) -> None:
    from costmodel.store.locks import LockBusyError, MeasureLockConfig, measuring

    module = importlib.import_module(f"experiments.{cfg.name}")
    times_here = measures(module, cfg)
    if times_here:
        refuse_parallel_measuring(f"experiment={cfg.name}")
    # the config is checked here, once: the schema and the plan the experiment derives from it
    # (a bad config fails at once, not after waiting for the measuring lock); run gets the plan
    plan = module.validate(cfg)
    if not times_here:
        module.run(cfg, plan=plan)
        return
    try:
        # the whole experiment (calibration, freshness check, layer timing) holds the
        # machine's measuring lock: another measuring process would corrupt both timings
        with measuring(f"experiment={cfg.name}", MeasureLockConfig.from_cfg(cfg.get("measure_lock"))):
            module.run(cfg, plan=plan)
    except LockBusyError as busy:  # one line, not a traceback
        logging.getLogger("sim").error(str(busy))
        sys.exit(75)
    except KeyboardInterrupt:
        logging.getLogger("sim").warning("interrupted: kernels measured so far are kept in the profile; rerun the "
                                         "same command to continue (measured kernels are not repeated)")
        sys.exit(130)


if __name__ == "__main__":
    message = missing_plugin_message(sys.argv[1:])
    if message:
        sys.exit(f"error: {message}")
    main()
