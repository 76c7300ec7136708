"""`python -m costmodel {bench,fit} [hydra overrides]`, `compare A B`, `fleet ROOT [--out DIR]`.

- bench: measure this device's ceilings and a kernel suite into its profile;
- fit: fit cost models L0-L3 on the profile and evaluate them on held-out shapes;
- compare: median difference between two profiles' common kernels (run-to-run stability);
- fleet: every device profile under a root side by side (ceilings, efficiency, the same
  reference workloads predicted on each device, L0 and L3 rankings).

bench measures, so under a launcher that runs several jobs at once on this machine it
refuses to start (``costmodel.cli.launchers``); a launcher plugin that is not installed is
named with its package before Hydra starts.

Bad input prints one line (``error: ...``) and exits with status 2 (``costmodel.cli.errors``).

Exit codes: 130 after Ctrl-C (what was kept and how to resume is printed), 75 when
another process measures on this machine and ``measure_lock.mode=refuse`` (or the wait
timed out).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from costmodel.cli.errors import report_user_errors

USAGE = __doc__
EX_TEMPFAIL = 75  # sysexits.h: a temporary failure, the user is invited to retry


@hydra.main(version_base=None, config_path="../conf", config_name="bench")
@report_user_errors
def bench(cfg: DictConfig) -> None:
    from costmodel.cli.bench_command import run
    from costmodel.cli.launchers import refuse_parallel_measuring
    from costmodel.store.locks import LockBusyError

    refuse_parallel_measuring("python -m costmodel bench")
    try:
        run(cfg)
    except LockBusyError as busy:  # another process measures here: one line, not a traceback
        logging.getLogger("costmodel").error(str(busy))
        sys.exit(EX_TEMPFAIL)


@hydra.main(version_base=None, config_path="../conf", config_name="fit")
@report_user_errors
def fit(cfg: DictConfig) -> None:
    from costmodel.cli.fit_command import run

    run(cfg)


def compare(argv: list[str]) -> None:
    from costmodel.cli.errors import USAGE_EXIT_CODE, USER_ERRORS, full_error_wanted, one_line
    from costmodel.cli.compare import main

    try:
        main(argv)
    except USER_ERRORS as err:  # not a Hydra app: print the one line ourselves
        if full_error_wanted():
            raise
        print(one_line(err), file=sys.stderr)
        sys.exit(USAGE_EXIT_CODE)


def fleet(argv: list[str]) -> None:
    from costmodel.cli.fleet import main

    main(argv)


def main() -> None:
    commands = {"bench": bench, "fit": fit}
    plain = {"compare": compare, "fleet": fleet}
    if len(sys.argv) < 2 or sys.argv[1] not in (*commands, *plain):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    command = sys.argv.pop(1)
    try:
        if command in plain:
            plain[command](sys.argv[1:])
            return
        from costmodel.cli.launchers import missing_plugin_message

        message = missing_plugin_message(sys.argv[1:])
        if message:
            sys.exit(f"error: {message}")
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
