"""Scripts under ``scripts/`` are files, not a package: tests load one by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def loaded_script(name: str) -> Iterator[ModuleType]:
    """``scripts/<name>.py`` imported as module ``name`` (registered in ``sys.modules`` while the file
    runs, as dataclasses look their module up), and unregistered afterwards: a generator for a fixture."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)
