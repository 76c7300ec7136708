"""Hydra launchers: which package provides each, and the rule that measuring jobs never
share one machine's cores.

Launchers (``-m ... hydra/launcher=NAME``; README "Sweeps on many cores and many machines"):

- ``joblib`` (package hydra-joblib-launcher): jobs in parallel worker processes on this
  machine; for predict-only sweeps (``measure=false``);
- ``submitit_local`` / ``submitit_slurm`` (package hydra-submitit-launcher): every job as a
  submitit job, on this machine or as a Slurm job; ``slurm_node`` (conf/hydra/launcher/)
  is ``submitit_slurm`` with one job per node, the node to itself (``--exclusive``).

A launcher whose plugin is not installed is refused before Hydra starts, naming the
package to install (Hydra's own message only lists the launchers it found). A job that
measures refuses to run under a launcher that runs several jobs at once on one machine
(joblib with ``n_jobs`` other than 1, submitit_local): two timing loops on shared cores time
each other (the README measured one run 18x slower that way). A ``-m`` sweep with such a job
is refused in the launching process before any job starts (``sweep_refusal``, called by the
sweep callback ``costmodel.cli.sweep_check.ValidateSweep`` with ``job_measures``); each job still
checks again for itself (``refuse_parallel_measuring``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import Any, Mapping, Sequence

#: launcher name -> (module the plugin installs, the package that provides it)
PLUGINS: dict[str, tuple[str, str]] = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "slurm_node": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
}
_LAUNCHER_ARG = re.compile(r"^(?:override\s+)?\+{0,2}hydra/launcher=(?P<name>[\w.-]+)$")


class LauncherError(RuntimeError):
    """A launcher cannot be used as asked."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_plugin_message(argv: Sequence[str]) -> str | None:
    """Why the ``hydra/launcher=NAME`` on this command line cannot be used, or None."""
    for arg in argv:
        m = _LAUNCHER_ARG.match(arg.strip())
        if not m or m["name"] not in PLUGINS:
            continue
        module, package = PLUGINS[m["name"]]
        if not _installed(module):
            return (f"hydra/launcher={m['name']} needs the Hydra plugin package {package!r}, which is not installed "
                    f"here: pip install {package}  (or pip install -e '.[launchers]')")
    return None


def parallel_reason(launcher: Mapping[str, Any]) -> str | None:
    """Why the launcher config ``launcher`` (``hydra.launcher``) runs several jobs at once on
    this machine, or None (basic launcher, joblib with n_jobs=1, Slurm)."""
    target = str(launcher.get("_target_", ""))
    if target.endswith("JoblibLauncher"):
        n_jobs = launcher.get("n_jobs")
        if n_jobs not in (1, None):
            return f"the joblib launcher runs hydra.launcher.n_jobs={n_jobs} jobs at once here"
    elif target.endswith("submitit_launcher.LocalLauncher"):
        return "the submitit_local launcher starts every job at once on this machine"
    return None


def parallel_on_this_machine() -> str | None:
    """Inside a Hydra job: why its launcher runs several jobs at once on this machine, or
    None (basic launcher, joblib with n_jobs=1, Slurm, or not under Hydra at all)."""
    from hydra.core.hydra_config import HydraConfig

    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None  # a single run (no -m) runs in this process whatever launcher is configured
    return parallel_reason(HydraConfig.get().launcher)


#: how to get out of a refusal (the same words inside a job and before a sweep)
WAYS_OUT = ("Run the sweep with the basic launcher (drop hydra/launcher; jobs run one after another), with "
            "hydra.launcher.n_jobs=1, or one job per node with hydra/launcher=slurm_node; predict-only jobs "
            "(measure=false: moe_design, moe_skew, gnn_degree) may run in parallel.")


def refuse_parallel_measuring(what: str) -> None:
    """Raise before any work when a measuring job runs beside others on this machine."""
    reason = parallel_on_this_machine()
    if reason:
        raise LauncherError(
            f"{what} measures on this machine, and {reason}: jobs timing at once share its cores and time each other. "
            + WAYS_OUT
        )


def job_measures(cfg: Mapping[str, Any]) -> bool:
    """Whether one job of a ``python -m costmodel bench`` sweep (its composed config) times
    anything on this machine: always. ``python -m sim`` sweeps pass their own rule
    (``sim.__main__.job_measures``, in conf/config.yaml's ``validate_sweep`` callback): this
    package sits below ``sim`` and never imports it."""
    return True


def sweep_refusal(launcher: Mapping[str, Any], measuring: Sequence[str], jobs: int) -> str | None:
    """Before a ``-m`` sweep starts: why it cannot run (one paragraph), or None.

    ``launcher`` is the sweep's ``hydra.launcher``, ``measuring`` the jobs that measure (each
    named by its overrides), ``jobs`` how many the sweep has."""
    reason = parallel_reason(launcher)
    if not reason or not measuring:
        return None
    shown = "; ".join(measuring[:3]) + ("; ..." if len(measuring) > 3 else "")
    return (f"{len(measuring)} of {jobs} jobs of this sweep measure on this machine ({shown}), and {reason}: jobs "
            f"timing at once share its cores and time each other, so no job was run. " + WAYS_OUT)
