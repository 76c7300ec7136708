"""Trace the config-handling path of one ``python -m sim`` run, up to its first measurement.

Composes the Hydra config of ``experiment=moe_skew`` (``initialize_config_dir`` +
``compose``, conf/), then calls the entry point's task function ``sim.__main__.main`` with
it (Hydra passes a given config straight through) under ``sys.setprofile``. The first
measuring call (``calibrated_model`` as the experiment module names it; ``fitted_model`` with
``measure=false``) is replaced by a function raising a sentinel, so what is traced is
exactly what happens to the config before anything is timed: the entry point's checks,
the measuring lock (``measure_lock.mode=off`` here: nothing else is waited for), and what
``run`` does with the config (validation, runtime, routings, traces) before its first
measurement.

Counted, over project files only (``costmodel/``, ``sim/``, ``experiments/``; third-party
code, the standard library and this script are skipped but seen through: a project
function called from inside Hydra or functools counts as called by the nearest project
frame below it):

(a) files entered: distinct project files in which some function ran; and ``entries``
    per file: calls into that file from a function of another project file.
(b) back-and-forth: the times a function of a project file returns to a caller in a
    *lower* layer, layers by package: costmodel (0) < sim (1) < experiments (2). Under
    strict layering a caller only ever calls down, so each such return is a call up the
    layering (the lower-layer file handing control to a higher one that then returns to
    it: the entry point in ``sim`` calling ``experiments.<name>.validate``, ``costmodel``'s
    error decorator calling the ``sim`` task, ...). Also given: ``cross-file calls``, calls
    from a function of one project file into another project file (any direction).
(c) validation runs: how many times each validation function ran (a function whose
    name contains ``check`` or ``validate``, plus the known checkers listed in
    ``VALIDATORS``), counted per qualified name. Kernel descriptors checking their own
    fields (costmodel/families/), the checks ``route()`` makes of its arguments at every
    sweep point and a dataclass's ``__post_init__`` checks (one per object) are argument checks of library code, not config validation: listed apart.

Usage: ``PYTHONPATH=. python scripts/trace_config_path.py [--json] [overrides ...]``
(default overrides: ``experiment=moe_skew measure_lock.mode=off progress=false``).

Before the config schema (commit 8e61d7d; the default overrides, measure=true)::

    (a) project files entered: 29 (experiments/common.py entered 12 times from other files)
    (b) back-and-forth: 11 (8 x sim/workloads/memory.py -> experiments/moe_skew.py:<genexpr>,
        sim/__main__.py -> moe_skew.validate, sim/__main__.py -> moe_skew.run,
        costmodel/cli/errors.py -> sim/__main__.py:main); cross-file calls: 5981 (most of them
        the layers' traces building kernel descriptors, the same before and after)
    (c) validation runs: 22 functions ran more than once: moe_skew.validate 2, check_common 2,
        check_measure 2, check_measure_keys 3, calibration_options 3, paired_enabled 3,
        config_dict 3, backend_list 2, moe_configs 2, routing_generators 2,
        instantiate_sweep 2, generator_keys 2, check_fits_device 2, check_capacity_factor 2,
        runtime.check_cfg 3, timing_config 4, MeasureLockConfig.from_cfg 5, check_dtype 3,
        check_threads 4, resolve_device 3, check_policy 3, check_tolerance 3

After (the schema, ``costmodel/cli/config_schema.py``, checked once by the entry point,
which hands ``validate``'s plan to ``run``; same overrides)::

    (a) project files entered: 29 (costmodel/cli/config_schema.py added, entered 26 times, one
        per constraint walked; experiments/common.py entered 9 times)
    (b) back-and-forth: 4 (sim/__main__.py -> moe_skew.validate and -> moe_skew.run, the
        entry point's two calls into its experiment; costmodel/cli/errors.py ->
        sim/__main__.py:main, the error decorator; costmodel/cli/config_schema.py ->
        experiments/common.py, the one cross-field Rule of the shared schema);
        cross-file calls: 5928
    (c) validation runs: every function once (moe_skew.validate, check_common, check_cfg,
        config_schema.check, check_dtype, moe_configs, routing_generators, instantiate_sweep,
        generator_keys, check_fits_device, resolve_device, ...), except two that build or
        convert what they are given, twice each: config_dict (the DictConfig as a dict, in
        validate and in run) and MeasureLockConfig.from_cfg (the lock the entry point holds,
        and the Runtime's copy); the per-object argument checks are as before.
    With measure=false: the same, MeasureLockConfig.from_cfg once (no lock is taken).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {"costmodel": 0, "sim": 1, "experiments": 2}
DEFAULT_OVERRIDES = ["experiment=moe_skew", "measure_lock.mode=off", "progress=false"]
#: validation functions whose names say neither check nor validate
VALIDATORS = {"config_dict", "calibration_options", "paired_enabled", "timing_config", "backend_list",
              "instantiate_sweep", "generator_keys", "moe_configs", "routing_generators", "graph_sweep",
              "resolve_device", "from_cfg", "measures", "prepare", "plan"}


#: not config validation: kernel descriptors checking their fields, and checks a library
#: function makes of its own arguments each time it is called (route() per sweep point)
ARGUMENT_CHECK_FILES = ("costmodel/families/",)
ARGUMENT_CHECK_CALLERS = {"route", "__post_init__"}


class Sentinel(Exception):
    """Raised by the first measuring call: the traced path ends there."""


def _project_file(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in LAYERS else None


def trace(overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import importlib

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    name = cfg.name
    module = importlib.import_module(f"experiments.{name}")
    entry = importlib.import_module("sim.__main__")

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Sentinel()

    patched = {attr: getattr(module, attr) for attr in ("calibrated_model", "fitted_model") if hasattr(module, attr)}
    for attr in patched:
        setattr(module, attr, stop)

    files: Counter[str] = Counter()          # function runs per file
    entries: Counter[str] = Counter()        # calls into a file from another project file
    validations: Counter[str] = Counter()
    argument_checks: Counter[str] = Counter()  # checks of a library function's own arguments, per object
    counts = {"back_and_forth": 0, "cross_file_calls": 0}
    upcalls: Counter[str] = Counter()        # back-and-forth by (caller file -> function)
    stack: list[tuple[str | None, str]] = []  # (project file or None, function) of each live frame
    nearest: list[str | None] = []           # nearest project file at or below each live frame

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = _project_file(frame.f_code.co_filename)
            below = nearest[-1] if nearest else None
            stack.append((path, frame.f_code.co_name))
            nearest.append(path or below)
            if path is None:
                return
            files[path] += 1
            if below is not None and below != path:
                entries[path] += 1
                counts["cross_file_calls"] += 1
            fn = frame.f_code.co_name
            if "check" in fn or "validate" in fn or fn in VALIDATORS:
                qual = getattr(frame.f_code, "co_qualname", fn)
                mod = path[:-3].replace("/", ".")
                caller = stack[-2][1] if len(stack) > 1 else ""
                per_object = path.startswith(ARGUMENT_CHECK_FILES) or caller in ARGUMENT_CHECK_CALLERS
                (argument_checks if per_object else validations)[f"{mod}.{qual}"] += 1
        elif event == "return":
            if not stack:
                return
            path, fn = stack.pop()
            nearest.pop()
            below = nearest[-1] if nearest else None
            if path is not None and below is not None and below != path:
                if LAYERS[below.split("/")[0]] < LAYERS[path.split("/")[0]]:
                    counts["back_and_forth"] += 1
                    upcalls[f"{below} -> {path}:{fn}"] += 1

    outcome = "returned"
    sys.setprofile(profiler)
    try:
        entry.main(cfg)
    except Sentinel:
        outcome = "stopped at the first measuring call"
    except SystemExit as err:
        outcome = f"exit {err.code}"
    finally:
        sys.setprofile(None)
        for attr, fn in patched.items():
            setattr(module, attr, fn)
    return {"overrides": overrides, "outcome": outcome, "files_entered": len(files),
            "back_and_forth": counts["back_and_forth"], "cross_file_calls": counts["cross_file_calls"],
            "back_and_forth_calls": dict(upcalls.most_common()),
            "entries_per_file": dict(entries.most_common()), "validation_runs": dict(sorted(validations.items())),
            "argument_checks": dict(sorted(argument_checks.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    report = trace(args.overrides or DEFAULT_OVERRIDES)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"overrides: {' '.join(report['overrides'])} ({report['outcome']})")
    print(f"(a) project files entered: {report['files_entered']}")
    print(f"(b) back-and-forth (returns to a lower layer's caller): {report['back_and_forth']}; "
          f"cross-file calls: {report['cross_file_calls']}")
    for call, n in report["back_and_forth_calls"].items():
        print(f"    {n} x {call}")
    print("    entries per file: " + ", ".join(f"{f} {n}" for f, n in report["entries_per_file"].items()))
    print("(c) validation runs:")
    for fn, n in report["validation_runs"].items():
        print(f"    {fn}: {n}")
    print("    (argument checks of library code, per object, not config validation: "
          + ", ".join(f"{f} {n}" for f, n in report["argument_checks"].items()) + ")")


if __name__ == "__main__":
    main()
