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
each other (the README measured one run 18x slower that way).
"""

from __future__ import annotations

import importlib.util
import re
from typing import Sequence

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


def parallel_on_this_machine() -> str | None:
    """Inside a Hydra job: why its launcher runs several jobs at once on this machine, or
    None (basic launcher, joblib with n_jobs=1, Slurm, or not under Hydra at all)."""
    from hydra.core.hydra_config import HydraConfig

    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None  # a single run (no -m) runs in this process whatever launcher is configured
    launcher = HydraConfig.get().launcher
    target = str(launcher.get("_target_", ""))
    if target.endswith("JoblibLauncher"):
        n_jobs = launcher.get("n_jobs")
        if n_jobs not in (1, None):
            return f"the joblib launcher runs hydra.launcher.n_jobs={n_jobs} jobs at once here"
    elif target.endswith("submitit_launcher.LocalLauncher"):
        return "the submitit_local launcher starts every job at once on this machine"
    return None


def refuse_parallel_measuring(what: str) -> None:
    """Raise before any work when a measuring job runs beside others on this machine."""
    reason = parallel_on_this_machine()
    if reason:
        raise LauncherError(
            f"{what} measures on this machine, and {reason}: jobs timing at once share its cores and time each other. "
            "Run the sweep with the basic launcher (drop hydra/launcher; jobs run one after another), with "
            "hydra.launcher.n_jobs=1, or one job per node with hydra/launcher=slurm_node; predict-only jobs "
            "(measure=false) may run in parallel."
        )
