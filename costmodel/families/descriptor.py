"""The base of every kernel descriptor: one frozen, hashable dataclass per kernel family.

A descriptor is the single source of truth for a kernel's shape. The same object is
*run* by the microbenchmark suite (``costmodel.measure.runners``) and *predicted* by the cost
model (``costmodel.model.features`` / ``costmodel.model.models``), and the layers in ``sim`` emit
lists of them as their kernel trace. Each family's descriptor lives in its own module of
``costmodel.families``, with its runner, features and aten mapping.

Every descriptor has

- ``flops()``: useful floating-point work, multiply and add counted as one FLOP each
  (a MAC = 2 FLOPs), the convention of the CS336 resource-accounting assignment and of
  PaLM's MFU definition (Chowdhery et al. 2022, appendix B);
- ``bytes_moved()``: *ideal* memory traffic, each input read once and each output written
  once (the lower bound used by the roofline model, Williams, Waterman & Patterson,
  "Roofline", CACM 2009); real traffic is higher when caches thrash;
- ``intensity()``: arithmetic intensity, FLOPs per byte (same source).

Sizes are validated on construction: a bad field raises ``ValueError`` naming the field
and the allowed range, before any tensor is allocated or any timing starts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

# ----------------------------------------------------------------------------- dtypes

#: bytes per element of every dtype a descriptor may name (torch's element sizes)
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int64": 8,
    "int32": 4,
}
FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")
INDEX_BYTES = DTYPE_BYTES["int64"]  # every index tensor in this project is int64


def check_positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"{type(obj).__name__}.{name} must be a positive integer (>= 1), got {value!r}"
            )


def check_choice(obj: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {list(allowed)}, got {value!r}")


#: operand layouts of a matrix product, BLAS's transa/transb: "n" an operand stored as its
#: logical shape (row-major), "t" one stored transposed and passed as a transposed view (the
#: weight of ``nn.Linear``, stored [out, in] and multiplied as ``W.t()``; most operands of a
#: backward pass). The same product runs another kernel per layout: on the development VM
#: ``grouped_mm`` of 64 tokens over 16 experts' [1024, 4096] weights took 1.2x longer with the
#: weights transposed, 0.9x for [2048, 1024]; transformers' eager Mixtral experts (every
#: product "nt") spent 31.0 ms in ``mm`` where their "nn" microbenchmarks summed to 24.6 ms
#: (README, "Fourth pass").
LAYOUTS = ("nn", "nt", "tn", "tt")


def check_optional_choice(obj: object, name: str, allowed: tuple[str, ...]) -> None:
    """An optional field among ``allowed`` whose first entry is the default: the default is
    stored as None (unset), so a descriptor that names it keeps the key rows had before the
    field existed."""
    value = getattr(obj, name)
    if value is None:
        return
    if value not in allowed:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {list(allowed)} "
                         f"(or None = {allowed[0]!r}), got {value!r}")
    if value == allowed[0]:
        object.__setattr__(obj, name, None)


def check_layout(obj: object, name: str = "layout") -> None:
    """``layout`` among ``LAYOUTS``; "nn" is stored unset (``check_optional_choice``)."""
    check_optional_choice(obj, name, LAYOUTS)


def layout_flags(layout: Any) -> tuple[bool, bool]:
    """(A transposed, B transposed) of a descriptor's layout (None = "nn")."""
    text = layout or "nn"
    return text[0] == "t", text[1] == "t"


def check_cv(obj: object, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{type(obj).__name__}.{name} must be a finite number >= 0, got {value!r}")


# ----------------------------------------------------------------------------- base

_REGISTRY: dict[str, type["KernelSpec"]] = {}


@dataclass(frozen=True)
class KernelSpec:
    """Base of all descriptors. Subclasses set ``family`` and implement the formulas."""

    family: ClassVar[str] = ""
    #: dtypes this family accepts for ``dtype``
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.family:
            _REGISTRY[cls.family] = cls

    def __post_init__(self) -> None:
        check_choice(self, "dtype", self.allowed_dtypes)

    # -- formulas ---------------------------------------------------------------
    @property
    def elem_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]  # type: ignore[attr-defined]

    def flops(self) -> float:
        raise NotImplementedError

    def bytes_moved(self) -> float:
        raise NotImplementedError

    def intensity(self) -> float:
        """FLOPs per ideal byte moved (Williams et al. 2009)."""
        return self.flops() / self.bytes_moved()

    def read_prefix_numel(self) -> tuple[int | None, ...] | None:
        """Per input of the family's runner, how many leading elements one call reads where
        that is fewer than the operand holds (None: all of it); None for every family that
        reads its operands whole. The cold rotation (``costmodel.measure.runners``) spaces copies by
        what is read, so a call that reads a sliver of a large operand still reads it cold."""
        return None

    # -- tables -----------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The descriptor's field names, in declaration order (cached per class)."""
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(cls))
            setattr(cls, "_field_names", names)
        return names

    def to_record(self) -> dict[str, Any]:
        """Flat dict for tidy tables: ``family`` plus every field (tuples as strings)."""
        rec: dict[str, Any] = {"family": self.family}
        for name in self.field_names():
            rec[name] = record_value(getattr(self, name))
        return rec

    def key(self) -> str:
        """Stable text key: identical descriptors give identical keys (profile dedup)."""
        rec = self.to_record()
        # an optional field left unset (None) is not part of the key, so adding one to a
        # family keeps the keys of every row measured before it existed
        return "|".join(f"{k}={rec[k]}" for k in sorted(rec) if rec[k] is not None)

    def label(self) -> str:
        """Short human-readable name for tables."""
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
            if f.name != "dtype" and getattr(self, f.name) is not None
        )
        return f"{self.family}({fields})"


def record_value(value: Any) -> Any:
    """A field as a table cell: tuples (per-expert counts) as comma-separated text."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else value


def families() -> tuple[str, ...]:
    """Names of every registered kernel family."""
    return tuple(_REGISTRY)


def spec_class(family: str) -> type[KernelSpec]:
    try:
        return _REGISTRY[family]
    except KeyError:
        raise ValueError(f"unknown kernel family {family!r}; known families: {sorted(_REGISTRY)}") from None


#: field types that may be left unset (None): an empty cell in a table, absent from the key
OPTIONAL_TYPES = ("float | None", "str | None", "int | None")


def optional_fields(cls: type[KernelSpec]) -> frozenset[str]:
    """The fields of a family that may be left unset (None)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.type in OPTIONAL_TYPES)


def from_record(record: Mapping[str, Any]) -> KernelSpec:
    """Rebuild a descriptor from a table row written by ``to_record`` (extra keys ignored)."""
    cls = spec_class(str(record["family"]))
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.type in OPTIONAL_TYPES:
            value = record.get(f.name)
            missing = value is None or value == "" or (isinstance(value, float) and math.isnan(value))
            cast = {"str | None": str, "int | None": lambda v: int(float(v))}.get(f.type, float)
            kwargs[f.name] = None if missing else cast(value)
            continue
        value = record[f.name]
        if f.type in ("tuple[int, ...]",):
            value = tuple(int(v) for v in str(value).split(",") if v != "")
        elif f.type == "int":
            value = int(value)
        elif f.type == "float":
            value = float(value)
        elif f.type == "bool":
            value = value if isinstance(value, bool) else str(value).lower() in ("true", "1")
        else:
            value = str(value)
        kwargs[f.name] = value
    return cls(**kwargs)
