"""Command line: ``python -m costmodel.collectives bench|fit key=value ...``.

    python -m costmodel.collectives bench world_size=2 [suite=collectives] [profile_root=profiles]
                                          [allow_oversubscribe=false] [port=29500] [threads=1] [keep_awake=true]
    python -m costmodel.collectives fit [world_size=2] [backend=gloo] [profile_root=profiles] [threads=1]
                                        [keep_awake=true]

``suite`` is a name under conf/suite/ or a path to a yaml. ``fit`` prints the fitted L2
parameters, the L3 class per op and the held-out report (docs/collectives.md).
``threads`` and the steady allocator name the device profile the collectives sit under: the
one the multi-rank experiments read (they run ``threads: 1``, the steady allocator), so
what this command measures is what they use. ``keep_awake`` (default true, as the experiments
measure): a lowest-priority spinner per rank core keeps a rank that waits in a collective from
parking its core (``costmodel.collectives.awake``); false measures, and fits, the profile of
parked cores (``cores0-1`` instead of ``cores0-1-awake``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from costmodel.cli.key_values import int_arg, parse_key_values

USAGE = __doc__.split("\n\n")[1]
ALLOWED = {"bench": {"world_size", "suite", "profile_root", "allow_oversubscribe", "port", "timeout_s", "threads",
                     "keep_awake"},
           "fit": {"world_size", "backend", "profile_root", "threads", "keep_awake"}}


def _bool_arg(args: dict[str, str], key: str, default: bool) -> bool:
    value = args.get(key, str(default)).lower()
    if value not in ("true", "false"):
        raise SystemExit(f"{key} must be true or false, got {args[key]!r}")
    return value == "true"


def _as_the_experiments_run(args: dict[str, str]) -> None:
    """This process's threads and allocator as the multi-rank experiments set them, so the
    device fingerprint (and the collective profile's folder) is theirs."""
    import torch

    from costmodel.collectives.workers import usable_cores
    from costmodel.measure.allocator import configure_allocator

    n = len(usable_cores())
    threads = int_arg(args, "threads", 1)
    if not 1 <= threads <= n:
        raise SystemExit(f"threads must be an integer in [1, {n}] (the cores this process may use), got {threads}")
    torch.set_num_threads(threads)
    configure_allocator("steady")


def _parse(cmd: str, argv: list[str]) -> dict[str, str]:
    return parse_key_values(cmd, argv, ALLOWED, USAGE)


def suite_path(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml"):
        return p
    return Path(__file__).resolve().parents[2] / "conf" / "suite" / f"{name}.yaml"


def main(argv: list[str] | None = None) -> int:
    """Run a command; a bad argument or a failed run prints one clear message and returns 1."""
    from costmodel.collectives.spec import CollectiveSpecError
    from costmodel.collectives.store import CollectiveProfileError
    from costmodel.collectives.workers import EPTimeoutError, EPWorkerError, WorkerSetupError
    from costmodel.measure.device import ProfileMismatchError
    try:
        return _main(argv)
    except (CollectiveSpecError, CollectiveProfileError, WorkerSetupError, EPWorkerError, EPTimeoutError,
            ProfileMismatchError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ALLOWED:
        print(USAGE, file=sys.stderr)
        return 2
    cmd, args = argv[0], _parse(argv[0], argv[1:])
    root = args.get("profile_root", "profiles")
    _as_the_experiments_run(args)
    if cmd == "bench":
        from costmodel.collectives.bench import bench_collectives
        w = int_arg(args, "world_size", None)
        if w is None:
            raise SystemExit(f"bench needs world_size=W\n{USAGE}")
        bench_collectives(w, suite_path(args.get("suite", "collectives")), root,
                          allow_oversubscribe=_bool_arg(args, "allow_oversubscribe", False),
                          port=int_arg(args, "port", None),
                          timeout_s=float(args["timeout_s"]) if "timeout_s" in args else None,
                          keep_awake=_bool_arg(args, "keep_awake", True))
        return 0
    from costmodel.collectives.models import load_collective_model, to_json
    from costmodel.collectives.report import fit_report
    from costmodel.collectives.store import CollectiveProfile
    model = load_collective_model(world_size=int_arg(args, "world_size", 2), backend=args.get("backend", "gloo"),
                                  profile_root=root, keep_awake=_bool_arg(args, "keep_awake", True))
    print(f"collective profile: {model.fingerprint['source']}")
    print("fitted on all rows (L2 per op, L3 class chosen by grouped CV):")
    print(to_json(model))
    fit_report(CollectiveProfile.load(model.fingerprint["source"]).measurements())
    return 0


if __name__ == "__main__":
    sys.exit(main())
