"""The kernel-family registry: per family, its descriptor, how the suite builds and runs it,
and its model features.

Each family is one module of ``costmodel.families`` that defines its descriptor (a
``KernelSpec`` subclass: fields, ``flops()``, ``bytes_moved()``), a ``suite`` function (its
section of a suite yaml -> the descriptors to measure), a ``build`` function
(the suite's runner: inputs made once, outside the timed region), a ``features`` function
(the family's own model columns, beside the ones every family gets in
``costmodel.model.features``, and which of them bound the range a prediction is trusted in),
its torch call, and the aten ops that map to it (``costmodel.families.aten_map``),
and ends with ``register_family``. PyTorch registers FLOP formulas per aten op the same way
(``torch/utils/flop_counter.py``, ``register_flop_formula``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from costmodel.families.descriptor import KernelSpec

@dataclass(frozen=True)
class SuiteContext:
    """What a family's ``suite`` function may need beyond its yaml section."""

    dtype: str  # the profile's dtype
    scatter_backends: tuple[str, ...]  # the scatter backends this machine has
    memory_bytes: int  # the device's memory (sizes the GEMM trio)


#: (the family's section of a suite yaml, context) -> [(tag, descriptor)], validated
Suite = Callable[[Mapping[str, Any], SuiteContext], list[tuple[str, KernelSpec]]]
#: (descriptor, device, seeded generator, seed) -> (op, inputs): ``op(*inputs)`` runs the kernel once
Build = Callable[[Any, torch.device, torch.Generator, int], tuple[Callable[..., Any], tuple[Any, ...]]]
#: (rows of one family in a kernel table, the device's measured ceilings) -> feature columns
Features = Callable[[pd.DataFrame, Mapping[str, Any]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Family:
    """Everything the project knows about one kernel family."""

    name: str
    spec: type[KernelSpec]
    suite: Suite
    build: Build
    features: Features
    module: str  # the file that defines it
    #: its own features whose training range is checked at prediction time (extrapolation
    #: warnings), beside the ones every family has (``costmodel.model.features``)
    range_features: tuple[str, ...] = ()


_FAMILIES: dict[str, Family] = {}


def register_family(spec: type[KernelSpec], *, suite: Suite, build: Build, features: Features,
                    range_features: Iterable[str] = ()) -> Family:
    """Register the family of ``spec`` (its ``family`` name) with its suite grid, runner, features
    and the ones of its features whose training range a prediction is checked against."""
    name = spec.family
    if not name:
        raise ValueError(f"{spec.__name__} sets no family name")
    if name in _FAMILIES:
        raise ValueError(f"kernel family {name!r} is registered twice ({_FAMILIES[name].module} and {spec.__module__})")
    family = Family(name, spec, suite, build, features, spec.__module__, tuple(range_features))
    _FAMILIES[name] = family
    return family


def family_of(name: str) -> Family:
    """The registered family called ``name`` (a clear error naming the known ones otherwise)."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known families: {sorted(_FAMILIES)}") from None


def registered() -> tuple[Family, ...]:
    """Every registered family, in registration order."""
    return tuple(_FAMILIES.values())


def grid(cfg: Mapping[str, Any], *names: str) -> Iterable[tuple[Any, ...]]:
    """The cartesian product of the suite lists ``names`` of one family's yaml section."""
    for name in names:
        if name not in cfg:
            raise ValueError(f"suite grid is missing the list {name!r}; it has {sorted(cfg)}")
    return itertools.product(*(list(cfg[n]) for n in names))
