"""One clear line, not a traceback, for a user's bad input at the command line.

Validation across the project raises ``ValueError`` (the convention scikit-learn's
``InvalidParameterError`` follows too), ``ProfileError`` or ``ProfileMismatchError`` with
a message naming the field and its allowed range. ``report_user_errors`` wraps a Hydra
task function (``python -m sim``, ``python -m costmodel bench|fit``): such an error is
logged with ``logging.error`` (so Hydra's run log holds it) as ``error: <message>`` and
the process exits with status 2 (the shell's usage-error code). The traceback goes to the
log at DEBUG level; ``HYDRA_FULL_ERROR=1`` re-raises instead, for developers.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, Callable, TypeVar

from costmodel.measure.device import ProfileMismatchError
from costmodel.store.profile import ProfileError

#: the exceptions validation raises for bad input (anything else is a bug: full traceback)
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, ProfileError, ProfileMismatchError)
#: exit status of a run refused for bad input
USAGE_EXIT_CODE = 2

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def full_error_wanted() -> bool:
    """True when the developer asked Hydra for whole tracebacks (``HYDRA_FULL_ERROR=1``)."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def one_line(err: BaseException) -> str:
    """``error: <message>``, newlines folded so the console shows one line."""
    text = " ".join(str(err).split()) or type(err).__name__
    return f"error: {text}"


def exit_for_user_error(err: BaseException) -> None:
    """Log ``err`` as one line and exit with status 2 (re-raise under ``HYDRA_FULL_ERROR=1``)."""
    if full_error_wanted():
        raise err
    log.debug("traceback of the refused run", exc_info=err)
    log.error(one_line(err))
    sys.stdout.flush()
    raise SystemExit(USAGE_EXIT_CODE)


def report_user_errors(task: F) -> F:
    """Decorator for a task function: user errors become one logged line and exit status 2."""

    @functools.wraps(task)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return task(*args, **kwargs)
        except USER_ERRORS as err:
            exit_for_user_error(err)

    return wrapper  # type: ignore[return-value]
