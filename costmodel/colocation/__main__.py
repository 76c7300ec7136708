"""Command line: ``python -m costmodel.colocation measure|show key=value ...``.

    python -m costmodel.colocation measure [profile.root=profiles] [threads=1] [dtype=float32]
                                           [allocator=steady] [cores=0,1] [per_family=4] [rounds=6]
                                           [families=gemm,gather]
    python -m costmodel.colocation show [profile.root=profiles] [threads=1] [dtype=float32]

``measure`` times a few kernels of every family of this machine's profile for ``threads``
(cold caches, as ``costmodel bench`` measures) alone, beside a twin and beside a memory
stream on the other cores, and appends the factors to its colocation.json (about 75 s);
``show`` prints them.
"""

from __future__ import annotations

import sys

from costmodel.cli.key_values import int_arg, parse_key_values

USAGE = __doc__.split("\n\n")[1]
COMMON = {"profile.root", "threads", "dtype", "allocator"}
ALLOWED = {"measure": COMMON | {"cores", "per_family", "rounds", "families"}, "show": COMMON}


def _parse(cmd: str, argv: list[str]) -> dict[str, str]:
    return parse_key_values(cmd, argv, ALLOWED, USAGE)


def _profile(args: dict):
    import torch

    from costmodel.measure.allocator import configure_allocator
    from costmodel.measure.device import check_threads, fingerprint
    from costmodel.store.profile import DeviceProfile

    threads = check_threads(int_arg(args, "threads", 1))
    torch.set_num_threads(threads)
    configure_allocator(args.get("allocator", "steady"))
    fp = fingerprint(torch.device("cpu"), args.get("dtype", "float32"), cold_cache=True)
    return DeviceProfile.open(args.get("profile.root", "profiles"), fp, create=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ALLOWED:
        print(USAGE, file=sys.stderr)
        return 2
    cmd, args = argv[0], _parse(argv[0], argv[1:])
    from costmodel.colocation.store import ColocationError, load_colocation
    from costmodel.store.profile import ProfileError

    try:
        profile = _profile(args)
        if cmd == "show":
            found = load_colocation(profile)
            print(found.describe() if found else f"no co-location factors in {profile.path}")
            return 0
        from dataclasses import replace

        from costmodel.colocation.measure import DEFAULT_PER_FAMILY, DEFAULT_TIMING, measure_colocation

        cores = tuple(int_arg({"c": c}, "c", 0) for c in args.get("cores", "0,1").strip("[]()").split(","))
        families = [f for f in args["families"].strip("[]").split(",") if f] if "families" in args else None
        measure_colocation(profile, cores, per_family=int_arg(args, "per_family", DEFAULT_PER_FAMILY), families=families,
                           timing=replace(DEFAULT_TIMING, rounds=int_arg(args, "rounds", DEFAULT_TIMING.rounds)))
    except (ColocationError, ProfileError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
