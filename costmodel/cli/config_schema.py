"""The config schema: constraints as data, one ``check``, one error format.

In the style of scikit-learn's ``_parameter_constraints``: a schema is a dict from a dotted
field path (``"moe.top_k"``, ``"calibration.tolerance"``, ``"timing.*"`` for every key of a
section) to one constraint or a list of them (the value must satisfy one). A constraint is

* ``Interval(int, 1, None)`` / ``Interval(float, 0, 10, closed="neither")``: a number in a
  range (bools are not numbers here; floats must be finite);
* ``Options({"loop", "padded"})``: one of a few values;
* a type (``bool``, ``int``, ``str``): an instance of it (``int`` refuses ``bool``);
* ``None``: null;
* ``Names(options)``: one name or a list of names (among ``options`` when given);
* ``ListOf(constraint)``: a non-empty list whose every item satisfies ``constraint``;
* ``Keys(allowed)``: a mapping with only the allowed keys (an unknown one is named:
  ``timing.repeats must not be set (timing takes only [...]), got 3``);
* ``Rule(test, words)``: the rare cross-field rule, ``test(value, cfg) -> bool`` with the
  whole config at hand (``words`` may be a function of the config too).

``check(cfg, constraints)`` walks the dotted paths (a field the config lacks is skipped: the
yaml gives every default) and raises the first violation in one format::

    ValueError("<dotted.field> must be <constraint in words>, got <value!r>")

``BASE_CONSTRAINTS`` are conf/base.yaml's keys, shared by every entry point (``python -m sim``
and ``python -m costmodel bench|fit``, through ``costmodel.measure.runtime.check_cfg``);
each experiment adds its own (``experiments.common.COMMON_CONSTRAINTS`` and the module's
``CONSTRAINTS``). What is genuinely derived (the device a name resolves to, a generator's
keyword arguments, whether the layers fit in memory) stays a function, run once.

This module imports nothing of the project, so any layer can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

__all__ = ["Interval", "Options", "Names", "ListOf", "Keys", "Rule", "check", "describe", "field_values",
           "at_most", "is_int", "BASE_CONSTRAINTS", "MISSING"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


#: what ``field_values`` yields for a path the config lacks
MISSING = _Missing()


def _number(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Interval:
    """A number of ``kind`` (int or float: an int is a float here too) between ``left`` and
    ``right`` (None: unbounded), ``closed`` "both", "left", "right" or "neither"."""

    kind: type
    left: float | None
    right: float | None
    closed: str = "both"
    words: str | None = None

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        if isinstance(value, bool):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if self.kind is float and (not isinstance(value, (int, float)) or not math.isfinite(value)):
            return False
        lo_ok = self.left is None or (value >= self.left if self.closed in ("both", "left") else value > self.left)
        hi_ok = self.right is None or (value <= self.right if self.closed in ("both", "right") else value < self.right)
        return lo_ok and hi_ok

    def describe(self, cfg: Mapping[str, Any]) -> str:
        if self.words:
            return self.words
        noun = "integer" if self.kind is int else "number"
        lo, hi = self.left, self.right
        if hi is None and lo is None:
            return f"an {noun}" if noun == "integer" else "a finite number"
        if hi is None:
            if self.kind is int and lo == 1 and self.closed in ("both", "left"):
                return "a positive integer (>= 1)"
            if self.kind is int and lo == 0 and self.closed in ("both", "left"):
                return "a non-negative integer (>= 0)"
            op = ">=" if self.closed in ("both", "left") else ">"
            return f"{'an' if noun == 'integer' else 'a'} {noun} {op} {_number(lo)}"
        if lo is None:
            op = "<=" if self.closed in ("both", "right") else "<"
            return f"{'an' if noun == 'integer' else 'a'} {noun} {op} {_number(hi)}"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        return f"{'an' if noun == 'integer' else 'a'} {noun} in {left}{_number(lo)}, {_number(hi)}{right}"


@dataclass(frozen=True)
class Options:
    """One of ``values`` (shown in the given order when a list or tuple)."""

    values: Iterable[Any]
    words: str | None = None

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        try:
            return any(value == v and type(value) is type(v) for v in self.values)
        except TypeError:
            return False

    def describe(self, cfg: Mapping[str, Any]) -> str:
        values = list(self.values) if isinstance(self.values, (list, tuple)) else sorted(self.values, key=str)
        return self.words or f"one of {values}"


@dataclass(frozen=True)
class Names:
    """One name or a list of names (``moe.backends=loop`` is one backend), from ``options``
    when given; ``min_len`` names at least."""

    options: Sequence[str] | None = None
    what: str = "name"
    min_len: int = 1

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            return False
        return len(names) >= self.min_len and (self.options is None or all(n in self.options for n in names))

    def describe(self, cfg: Mapping[str, Any]) -> str:
        among = f" among {list(self.options)}" if self.options is not None else ""
        return f"a {self.what} or a list of {self.what}s{among}"


@dataclass(frozen=True)
class ListOf:
    """A list of at least ``min_len`` (at most ``max_len``) items, each satisfying ``item``
    (a constraint or a list of them)."""

    item: Any
    min_len: int = 1
    words: str | None = None
    max_len: int | None = None

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        return (isinstance(value, (list, tuple)) and len(value) >= self.min_len
                and (self.max_len is None or len(value) <= self.max_len)
                and all(_accepts(self.item, v, cfg) for v in value))

    def describe(self, cfg: Mapping[str, Any]) -> str:
        if self.words:
            return self.words
        each = describe(self.item, cfg)
        return f"a {'non-empty ' if self.min_len == 1 else ''}list, each {each}"


@dataclass(frozen=True)
class Keys:
    """A mapping whose keys are all among ``allowed`` (null: an empty mapping)."""

    allowed: Sequence[str]

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        return value is None or (isinstance(value, Mapping) and all(k in self.allowed for k in value))

    def describe(self, cfg: Mapping[str, Any]) -> str:
        return f"a mapping with keys among {sorted(self.allowed)}"


@dataclass(frozen=True)
class Rule:
    """A cross-field rule: ``test(value, cfg)`` says whether the value is allowed given the
    rest of the config; ``words`` (or ``words(cfg)``) says what is allowed."""

    test: Callable[[Any, Mapping[str, Any]], bool]
    words: str | Callable[[Mapping[str, Any]], str]

    def accepts(self, value: Any, cfg: Mapping[str, Any]) -> bool:
        return bool(self.test(value, cfg))

    def describe(self, cfg: Mapping[str, Any]) -> str:
        return self.words(cfg) if callable(self.words) else self.words


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def field(cfg: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (a KeyError when missing)."""
    node: Any = cfg
    for part in path.split("."):
        node = node[part]
    return node


def at_most(path: str, low: int = 1, words: str = "in") -> Rule:
    """An integer in [low, the integer at ``path``]: ``moe.top_k`` against ``moe.num_experts``
    ("moe.top_k must be in [1, moe.num_experts=4], got 9"); ``words="an integer in"`` shows
    the bound's value only ("... must be an integer in [2, 512], got 1000")."""
    def bound(cfg: Mapping[str, Any]) -> str:
        return f"{path}={field(cfg, path)}" if words == "in" else str(field(cfg, path))

    return Rule(lambda v, cfg: is_int(v) and low <= v <= field(cfg, path),
                lambda cfg: f"{words} [{low}, {bound(cfg)}]")


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def _accepts(constraint: Any, value: Any, cfg: Mapping[str, Any]) -> bool:
    if isinstance(constraint, list):
        return any(_accepts(c, value, cfg) for c in constraint)
    if constraint is None:
        return value is None
    if isinstance(constraint, type):
        if constraint in (int, float) and isinstance(value, bool):
            return False
        if constraint is float:
            return isinstance(value, (int, float)) and math.isfinite(value)
        return isinstance(value, constraint)
    return constraint.accepts(value, cfg)


def describe(constraint: Any, cfg: Mapping[str, Any] | None = None) -> str:
    """A constraint (or a list of them: any of) in words."""
    cfg = cfg or {}
    if isinstance(constraint, list):
        words = [describe(c, cfg) for c in constraint if c is not None]
        nullable = any(c is None for c in constraint)
        return " or ".join(words) + (" or null" if nullable else "") if words else "null"
    if constraint is None:
        return "null"
    if isinstance(constraint, type):
        return _TYPE_WORDS.get(constraint, f"a {constraint.__name__}")
    return constraint.describe(cfg)


def field_values(cfg: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every field ``path`` names: a ``*`` part matches every key
    of its mapping; a path through a missing key or a non-mapping yields ``MISSING``."""
    def walk(node: Any, parts: list[str], done: str) -> Iterator[tuple[str, Any]]:
        if not parts:
            yield done, node
            return
        head, rest = parts[0], parts[1:]
        if not isinstance(node, Mapping) and not hasattr(node, "keys"):
            yield (f"{done}.{head}" if done else head), MISSING
            return
        keys = list(node.keys()) if head == "*" else [head]
        for key in keys:
            where = f"{done}.{key}" if done else str(key)
            yield from (walk(node[key], rest, where) if key in node else [(where, MISSING)])

    yield from walk(cfg, path.split("."), "")


def check(cfg: Mapping[str, Any], constraints: Mapping[str, Any]) -> None:
    """Every field of ``constraints`` present in ``cfg`` satisfies its constraint, else a
    ValueError: ``<dotted.field> must be <constraint in words>, got <value!r>``."""
    for path, constraint in constraints.items():
        for where, value in field_values(cfg, path):
            if value is MISSING:
                continue
            keys = next((c for c in (constraint if isinstance(constraint, list) else [constraint])
                         if isinstance(c, Keys)), None)
            if keys is not None and isinstance(value, Mapping):  # name the unknown key itself
                unknown = [k for k in value if k not in keys.allowed]
                if unknown:
                    raise ValueError(f"{where}.{unknown[0]} must not be set ({where} takes only "
                                     f"{sorted(keys.allowed)}), got {value[unknown[0]]!r}")
            if not _accepts(constraint, value, cfg):
                raise ValueError(f"{where} must be {describe(constraint, cfg)}, got {value!r}")


def _timing_constraints() -> dict[str, Any]:
    """``timing.<key>``: the type of ``TimingConfig``'s field, unknown keys refused."""
    import dataclasses

    from costmodel.measure.timing import TimingConfig

    out: dict[str, Any] = {}
    fields = dataclasses.fields(TimingConfig)
    out["timing"] = [Keys([f.name for f in fields]), None]
    for f in fields:
        default = f.default
        out[f"timing.{f.name}"] = bool if isinstance(default, bool) else int if isinstance(default, int) else float
    return out


def _base_constraints() -> dict[str, Any]:
    from costmodel.measure.allocator import ALLOCATOR_MODES
    from costmodel.measure.device import DEVICE_KINDS, FLOAT_DTYPES
    from costmodel.store.locks import MEASURE_MODES

    return {
        "device": Options(list(DEVICE_KINDS)),
        "dtype": Options(list(FLOAT_DTYPES)),
        "allocator": Options(list(ALLOCATOR_MODES)),
        "threads": [Interval(int, 1, None), None],
        "seed": Interval(int, 0, None),
        **_timing_constraints(),
        "measure_lock": [Keys(["mode", "timeout_s", "path"]), None],
        "measure_lock.mode": Options(list(MEASURE_MODES)),
        "measure_lock.timeout_s": Interval(float, 0, None, closed="neither", words="a number of seconds > 0"),
        "limits.*.*": Interval(float, 0, None, closed="neither"),
    }


class _LazyConstraints(Mapping[str, Any]):
    """A constraints dict built on first use (its option lists come from costmodel.measure,
    which this module does not import at load time)."""

    def __init__(self, build: Callable[[], dict[str, Any]]) -> None:
        self._build = build
        self._data: dict[str, Any] | None = None

    def _get(self) -> dict[str, Any]:
        if self._data is None:
            self._data = self._build()
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


#: conf/base.yaml's keys, shared by every entry point
BASE_CONSTRAINTS: Mapping[str, Any] = _LazyConstraints(_base_constraints)
