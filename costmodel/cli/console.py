"""The console that also writes Hydra's run log: what a person saw is kept with the run.

Tables and messages are printed with rich; under Hydra the run's log file
(``<run dir>/<job>.log``) gets the same lines, without colour codes, through the root
logger's file handlers (never its console handler, so nothing is printed twice). Outside
Hydra (tests, the Python API) there is no file handler and only the console is written.

A string given to ``Console.print`` (or a table cell, or a title) is read as rich markup:
a ``[/]`` or ``[bold]`` in a device name, a path or an error message would be taken as a
tag (``MarkupError``, or text silently restyled). Anything a user or a file controls is
printed through ``literal`` (a ``rich.text.Text``, never parsed) or ``escape``
(``rich.markup.escape``, for a value placed inside a markup string).
"""

from __future__ import annotations

import io
import logging
import re
import sys

from rich.console import Console
from rich.markup import escape
from rich.text import Text

__all__ = ["escape", "literal", "make_console"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LOGGER = "console"


def _file_logger() -> logging.Logger:
    """A logger that writes only to the root logger's file handlers (Hydra's run log)."""
    logger = logging.getLogger(_LOGGER)
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for handler in files:
        if handler not in logger.handlers:
            logger.addHandler(handler)
    for handler in list(logger.handlers):
        if handler not in files:  # a finished Hydra job's file: not this run's
            logger.removeHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


class _ConsoleAndLog(io.TextIOBase):
    """A text stream that writes to stdout and, line by line, to the run log."""

    def __init__(self) -> None:
        self._pending = ""

    def write(self, text: str) -> int:
        sys.stdout.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        if lines:
            logger = _file_logger()
            if logger.handlers:
                for line in lines:
                    logger.info(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()


def make_console(width: int | None = None) -> Console:
    """A rich console whose output also goes to Hydra's run log."""
    return Console(file=_ConsoleAndLog(), width=width)


def literal(value: object, style: str = "") -> Text:
    """``str(value)`` printed as it is, never read as rich markup (``[/]`` stays ``[/]``)."""
    return Text(str(value), style=style)
