"""`python -m costmodel {bench,fit,compare} [hydra overrides]`.

- bench: measure this device's ceilings and a kernel suite into its profile;
- fit: fit cost models L0-L3 on the profile and evaluate them on held-out shapes;
- compare: median difference between two profiles' common kernels (run-to-run stability).

Exit codes: 130 after Ctrl-C (what was kept and how to resume is printed), 75 when
another process measures on this machine and ``measure_lock.mode=refuse`` (or the wait
timed out).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

USAGE = __doc__
EX_TEMPFAIL = 75  # sysexits.h: a temporary failure, the user is invited to retry


@hydra.main(version_base=None, config_path="../conf", config_name="bench")
def bench(cfg: DictConfig) -> None:
    from costmodel.bench_command import run
    from costmodel.locks import LockBusyError

    try:
        run(cfg)
    except LockBusyError as busy:  # another process measures here: one line, not a traceback
        logging.getLogger("costmodel").error(str(busy))
        sys.exit(EX_TEMPFAIL)


@hydra.main(version_base=None, config_path="../conf", config_name="fit")
def fit(cfg: DictConfig) -> None:
    from costmodel.fit_command import run

    run(cfg)


def compare(argv: list[str]) -> None:
    from costmodel.compare import main

    main(argv)


def main() -> None:
    commands = {"bench": bench, "fit": fit}
    if len(sys.argv) < 2 or sys.argv[1] not in (*commands, "compare"):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    try:
        if command == "compare":
            compare(sys.argv[1:])
        else:
            commands[command]()
    except KeyboardInterrupt as stop:  # Ctrl-C: one message (what was kept, how to resume), not a traceback
        message = str(stop) or f"interrupted; rerun `python -m costmodel {command}` to continue"
        if logging.getLogger().handlers:  # Hydra's logging: console and the run's log file
            logging.getLogger("costmodel").warning(message)
        else:
            print(message, file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
