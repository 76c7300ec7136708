"""Validate every job of a ``-m`` sweep before the first one runs (a Hydra callback).

Without it, ``python -m sim -m moe.top_k=1,9`` measured for minutes in job 0 before job 1
failed on ``moe.top_k=9``. ``ValidateSweep.on_multirun_start`` runs in the launching
process before the sweeper and launcher start (so it works with any launcher: basic,
joblib, submitit): it expands the sweep overrides as Hydra's basic sweeper does
(``hydra.sweeper.params`` plus the command line's overrides, cartesian product), composes
each job's config with the same config loader the sweeper uses, and calls the validator
on it: a function named by dotted path that builds configs and generators but measures
nothing and changes no process state (``python -m sim``: the experiment module's
``validate(cfg)`` via ``experiments.common.validate_experiment``; ``python -m costmodel
bench``: ``costmodel.cli.bench_command.validate``). Registered under ``hydra.callbacks`` in
conf/config.yaml and conf/bench.yaml.

Every invalid job is reported, one line each, naming the job's overrides and the error;
then the run stops with exit status 2 before any job started (``HYDRA_FULL_ERROR=1``
raises the first error with its traceback instead). Under a launcher that runs several
jobs at once on this machine (joblib with n_jobs other than 1, submitit_local), a sweep
with any job that measures (``costmodel.cli.launchers.job_measures``) is refused the same way,
in one paragraph naming the ways out (measure=false, the serial basic launcher, one job
per Slurm node). A sweep this callback cannot expand
(a sweeper with interval or other non-discrete sweeps) is left to the sweeper, with a note.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from costmodel.cli.errors import USER_ERRORS, exit_for_user_error, full_error_wanted, one_line

log = logging.getLogger(__name__)


def job_overrides(config: DictConfig) -> list[list[str]]:
    """The override list of every job the basic sweeper would launch for ``config``."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))  # type: ignore[arg-type]
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(arguments)
    (batch,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return batch


def compose_job(config: DictConfig, overrides: list[str]) -> DictConfig:
    """The config one job of the sweep will get (what the sweeper's launcher composes)."""
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().config_loader().load_sweep_config(config, overrides)


def check_jobs(config: DictConfig, validator: Callable[[DictConfig], Any]) -> list[tuple[list[str], BaseException]]:
    """(overrides, error) of every job whose config the validator refuses."""
    return check_sweep(config, validator)[0]


def check_sweep(config: DictConfig, validator: Callable[[DictConfig], Any],
                measures: Callable[[DictConfig], bool] | None = None,
                ) -> tuple[list[tuple[list[str], BaseException]], list[list[str]]]:
    """Every job's config composed once: (overrides, error) of each job the validator (or
    ``measures``) refuses, and the overrides of each valid job that ``measures`` says times
    something on this machine (none without ``measures``)."""
    from hydra.errors import HydraException

    failures, measuring = [], []
    for overrides in job_overrides(config):
        try:
            job = compose_job(config, overrides)
            validator(job)
            if measures is not None and measures(job):
                measuring.append(overrides)
        except (*USER_ERRORS, HydraException) as err:  # a bad value, or a key this job's config lacks
            failures.append((overrides, err))
    return failures, measuring


class ValidateSweep(Callback):
    """Hydra callback: refuse a multirun whose any job's config is invalid, or whose measuring
    jobs a parallel launcher would run side by side on this machine, before any job runs.

    ``validator`` is the dotted path of a function taking one job's composed config;
    ``measures`` of one saying whether that job times anything on this machine
    (``costmodel.cli.launchers.job_measures`` unless given).
    """

    def __init__(self, validator: str, measures: str = "costmodel.cli.launchers.job_measures") -> None:
        self.validator = validator
        self.measures = measures

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.errors import HydraException
        from hydra.utils import get_method

        from costmodel.cli.launchers import LauncherError, sweep_refusal

        try:
            jobs = job_overrides(config)
        except HydraException as err:  # e.g. interval sweeps of an optimising sweeper
            log.info(f"sweep configs not validated up front ({err}); each job validates its own")
            return
        # every launcher: measures() refuses measure=false where an experiment always measures
        failures, measuring = check_sweep(config, get_method(self.validator), get_method(self.measures))
        swept = [i for i in range(len(jobs[0])) if len({tuple(j)[i] for j in jobs}) > 1] if jobs else []

        def shown(overrides: list[str]) -> str:
            return " ".join([overrides[i] for i in swept] or overrides) or "(no overrides)"

        if failures:
            if full_error_wanted():
                raise failures[0][1]
            for overrides, err in failures:
                log.error(f"job {shown(overrides)}: {one_line(err)}")
            exit_for_user_error(ValueError(f"{len(failures)} of {len(jobs)} jobs of the sweep have invalid configs "
                                           "(listed above); no job was run"))
        refusal = sweep_refusal(config.hydra.launcher, [shown(o) for o in measuring], len(jobs))
        if refusal:
            exit_for_user_error(LauncherError(refusal))
        log.info(f"validated the configs of all {len(jobs)} jobs of the sweep")
