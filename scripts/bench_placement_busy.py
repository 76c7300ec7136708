"""Benchmark: `sim.place.placement.place` of 10 workloads on 2 devices, quiet and beside a CPU hog.

    python scripts/bench_placement_busy.py [--profile PROFILE_DIR] [--repeats 5] [--hog-processes 2]
                                           [--hog-seconds 30] [--limit-s 1.0]
                                           [--out results/cpu_epyc/benchmarks/placement_busy.json]

Issue 28's target: prediction stays fast on a busy machine, ``place`` of 10 workloads on 2
devices in under 1 s beside a CPU hog. The workloads are the tiny placement mix
(``conf/placement_mix/tiny.yaml``, read as data: only the builders of
``sim.place.placement_workloads`` it names are called) drawn with 10 seeds, its four entries in
turn; the devices are two ``sim.place.placement.Device`` of one committed profile (default: the
cold-cache Xeon profile, which holds every kernel family), each with its own ``CostModel``
object (so the two are predicted as two devices, not one model shared), 2 GiB each; the
predictor is L3 (the fitted models, the slowest level).

The models come from this user's model cache (``costmodel.store.model_cache``), fitted from the
profile on a miss; the fit is not timed (it is said whether the models were cached or fitted
now). One warm-up ``place``, then ``--repeats`` timed calls quiet, then as many beside the
hog: ``--hog-processes`` Python processes busy-looping, each ending by itself after
``--hog-seconds`` at most and always terminated (then killed) in ``finally``. A table of
median and spread (max - min) per phase is printed and the numbers written to ``--out`` as
JSON, with each phase's median CPU seconds (this process) and the 1-minute load average
before it: on a host that other work already loads, the wall time is mostly waiting for a
core, and the CPU time tells the two apart. Exit status: 0 when the busy median is within
``--limit-s``, 1 when it is not, 2 for bad input (one ``error:`` line, said before anything
is loaded or measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = ROOT / "profiles" / "cpu-intel-r-xeon-r-processor-t2-float32-2862a8a0be"
DEFAULT_OUT = Path("results/cpu_epyc/benchmarks/placement_busy.json")
MIX = ROOT / "conf" / "placement_mix" / "tiny.yaml"
WORKLOADS = 10
DEVICES = 2
DEVICE_MEMORY_BYTES = 2 * 2**30
LEVEL = "L3"
#: limits of each option (inclusive): the hog is bounded, so is the run
RANGES = {"repeats": (1, 50), "hog_processes": (1, 64), "hog_seconds": (1.0, 600.0), "limit_s": (1e-3, 3600.0)}
#: seconds the hog gets to start spinning before the busy phase is timed
HOG_SPIN_UP_S = 0.5


class BenchError(ValueError):
    """Bad input to the benchmark, said as one line before anything is measured."""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench_placement_busy.py", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="a profile folder (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed place() calls per phase (default: %(default)s)")
    parser.add_argument("--hog-processes", type=int, default=2, help="busy-looping processes (default: %(default)s)")
    parser.add_argument("--hog-seconds", type=float, default=30.0,
                        help="each hog process ends by itself after this many seconds (default: %(default)s)")
    parser.add_argument("--limit-s", type=float, default=1.0, help="target for the busy median (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output file (default: %(default)s)")
    args = parser.parse_args(list(argv))
    check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Every option in its range, ``--out`` a file that can be written, ``--profile`` a folder."""
    for name, (low, high) in RANGES.items():
        value = getattr(args, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
            raise BenchError(f"--{name.replace('_', '-')} must be in [{low:g}, {high:g}], got {value!r}")
    out: Path = args.out
    if out.exists() and not out.is_file():
        raise BenchError(f"--out {out} is a folder, not a file: name the JSON file to write")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BenchError(f"--out {out}: {parent} is a file, so no folder can be made below it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BenchError(f"--out {out}: {parent} is not writable by this user")
    if not (args.profile / "fingerprint.json").is_file():
        raise BenchError(f"--profile {args.profile} is not a device profile (no fingerprint.json in it)")


# ----------------------------------------------------------------------------- inputs


def tiny_workloads(n: int = WORKLOADS) -> list[Any]:
    """``n`` placement workloads from the tiny mix, its entries in turn, seed = index."""
    import yaml

    from sim.place import placement_workloads

    builders = {f"sim.place.placement_workloads.{name}": getattr(placement_workloads, name)
                for name in ("moe_workload", "gnn_workload", "mlp_workload")}
    mix = yaml.safe_load(MIX.read_text(encoding="utf-8"))
    if not isinstance(mix, dict) or not mix:
        raise BenchError(f"{MIX} must map workload names to builder configs, got {type(mix).__name__}")
    entries = list(mix.items())
    out = []
    for i in range(n):
        name, spec = entries[i % len(entries)]
        spec = dict(spec)
        target = spec.pop("_target_", None)
        if target not in builders:
            raise BenchError(f"{MIX}: {name}._target_ must be one of {sorted(builders)}, got {target!r}")
        out.append(builders[target](f"{name}#{i}", seed=i, **spec))
    return out


def devices_from(profile_dir: Path, n: int = DEVICES) -> tuple[list[Any], dict[str, Any]]:
    """``n`` devices of one profile, each with its own CostModel object, and how the models came."""
    import warnings

    from costmodel.model.predictor import CostModel
    from costmodel.store.profile import DeviceProfile
    from sim.place.placement import Device

    profile = DeviceProfile.load(profile_dir)
    started = time.perf_counter()
    models = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fitting chatter, extrapolation
        for _ in range(n):
            models.append(CostModel.load(profile))
    origin = models[0].origin  # "cache": from this user's model cache (warm); "fitted": fitted now, then cached
    info = {"profile": profile.fingerprint.id, "model_origin": origin,
            "model_load_s": round(time.perf_counter() - started, 3)}
    return [Device(f"cpu{i}", m, DEVICE_MEMORY_BYTES) for i, m in enumerate(models)], info


# ----------------------------------------------------------------------------- the hog


HOG_CODE = "import time\nend = time.monotonic() + {seconds!r}\nwhile time.monotonic() < end:\n    pass\n"


def start_hog(processes: int, seconds: float) -> list[subprocess.Popen]:
    """``processes`` busy loops, each ending by itself after ``seconds``."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG_CODE.format(seconds=float(seconds))],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    except BaseException:
        stop_hog(procs)
        raise
    return procs


def stop_hog(procs: Sequence[subprocess.Popen], grace_s: float = 2.0) -> None:
    """Terminate every hog process, kill one that does not end within ``grace_s``."""
    from costmodel.collectives.awake import stop_spinners

    stop_spinners(procs, grace_s=grace_s)


# ----------------------------------------------------------------------------- timing


def time_place(workloads: Sequence[Any], devices: Sequence[Any], repeats: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds (this process, all its threads) of each ``place`` call."""
    from sim.place.placement import place

    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        place(workloads, devices, LEVEL)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return wall, cpu


def _load_1min() -> float | None:
    """The 1-minute load average (runnable processes, all users), None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def summary(times: Sequence[float], cpu_times: Sequence[float] | None = None, load_before: float | None = None
            ) -> dict[str, Any]:
    """Median and spread (max - min) of the wall times; the median CPU time says how much of
    the wall time was this process's own work (the rest: waiting for a core)."""
    cpu = list(cpu_times) if cpu_times is not None else []
    return {"median_s": statistics.median(times), "spread_s": max(times) - min(times), "min_s": min(times),
            "max_s": max(times), "times_s": list(times), "cpu_median_s": statistics.median(cpu) if cpu else None,
            "cpu_times_s": cpu, "load_average_1min_before": load_before}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a temp file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(args: argparse.Namespace) -> dict[str, Any]:
    workloads = tiny_workloads()
    devices, models = devices_from(args.profile)
    print(f"{len(workloads)} workloads, {len(devices)} devices of {models['profile']}; models "
          + ("from this user's model cache (warm)" if models["model_origin"] == "cache"
             else f"fitted now ({models['model_load_s']:.1f} s, not timed) and cached for this user")
          + f"; predictor {LEVEL}", flush=True)
    time_place(workloads, devices, 1)  # warm-up
    load_quiet = _load_1min()
    quiet = time_place(workloads, devices, args.repeats)
    hog = start_hog(args.hog_processes, args.hog_seconds)
    try:
        time.sleep(HOG_SPIN_UP_S)
        if any(p.poll() is not None for p in hog):
            raise RuntimeError("a hog process ended before the busy phase started")
        load_busy = _load_1min()
        busy = time_place(workloads, devices, args.repeats)
    finally:
        stop_hog(hog)
    result = {
        "benchmark": "placement_busy", "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "workloads": len(workloads),
        "devices": len(devices), "predict": LEVEL, **models, "repeats": args.repeats, "warm_up_calls": 1,
        "hog": {"processes": args.hog_processes, "max_seconds": args.hog_seconds},
        "host": {"cpu_count": os.cpu_count(), "python": platform.python_version()},
        "quiet": summary(*quiet, load_quiet), "busy": summary(*busy, load_busy), "limit_s": args.limit_s,
    }
    result["passed"] = result["busy"]["median_s"] <= args.limit_s
    return result


def print_table(result: dict[str, Any]) -> None:
    print(f"{'phase':<12}{'median_s':>10}{'spread_s':>10}{'min_s':>9}{'max_s':>9}{'cpu_median_s':>14}{'load_1min':>11}")
    for phase, label in (("quiet", "quiet"), ("busy", "beside hog")):
        s = result[phase]
        cpu, load = s["cpu_median_s"], s["load_average_1min_before"]
        print(f"{label:<12}{s['median_s']:>10.3f}{s['spread_s']:>10.3f}{s['min_s']:>9.3f}{s['max_s']:>9.3f}"
              + (f"{cpu:>14.3f}" if cpu is not None else f"{'-':>14}") + (f"{load:>11.2f}" if load is not None else f"{'-':>11}"))
    verdict = "within" if result["passed"] else "OVER"
    print(f"busy median {result['busy']['median_s']:.3f} s: {verdict} the {result['limit_s']:g} s target "
          f"({result['hog']['processes']} hog processes, {result['host']['cpu_count']} CPUs)")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from costmodel.cli.errors import USER_ERRORS, one_line

    try:
        result = run(args)
    except USER_ERRORS as err:  # BenchError, a corrupt profile, one without the workloads' kernel families
        print(one_line(err), file=sys.stderr)
        return 2
    print_table(result)
    write_json(args.out, result)
    print(f"written to {args.out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
