"""Kernel descriptors: one frozen, hashable dataclass per kernel family.

A descriptor is the single source of truth for a kernel's shape. The same object is
*run* by the microbenchmark suite (``costmodel.runners``) and *predicted* by the cost
model (``costmodel.features`` / ``costmodel.models``), and the layers in ``sim`` emit
lists of them as their kernel trace.

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


def _check_positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(
                f"{type(obj).__name__}.{name} must be a positive integer (>= 1), got {value!r}"
            )


def _check_choice(obj: object, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ValueError(f"{type(obj).__name__}.{name} must be one of {list(allowed)}, got {value!r}")


def _check_cv(obj: object, name: str) -> None:
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
        _check_choice(self, "dtype", self.allowed_dtypes)

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
            f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self) if f.name != "dtype"
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
OPTIONAL_TYPES = ("float | None",)


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
            kwargs[f.name] = None if missing else float(value)
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


# ----------------------------------------------------------------------------- GEMM


@dataclass(frozen=True)
class GemmSpec(KernelSpec):
    """C[M, N] = A[M, K] @ B[K, N] (``torch.matmul``)."""

    family: ClassVar[str] = "gemm"
    m: int
    k: int
    n: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "m", "k", "n")

    def flops(self) -> float:
        # 2MKN: each of the MN outputs takes K multiplies and K adds (CS336; seed article).
        return 2.0 * self.m * self.k * self.n

    def bytes_moved(self) -> float:
        # s(MK + KN + MN): A and B read once, C written once (seed article 19.2.5).
        return float(self.elem_bytes * (self.m * self.k + self.k * self.n + self.m * self.n))


# ----------------------------------------------------------------------------- grouped GEMM

GROUPED_IMPLS = ("padded_bmm", "grouped_mm")


@dataclass(frozen=True)
class GroupedGemmSpec(KernelSpec):
    """One GEMM per expert, Y_e[n_e, N] = X_e[n_e, K] @ W_e[K, N], in a single call.

    ``impl`` says how the call is made: ``padded_bmm`` pads every expert to the busiest
    expert's token count and runs ``torch.bmm`` (it pays for max(n_e) * E rows);
    ``grouped_mm`` runs ``torch.nn.functional.grouped_mm`` over the ragged groups.
    """

    family: ClassVar[str] = "grouped_gemm"
    tokens_per_expert: tuple[int, ...]
    k: int
    n: int
    impl: str = "grouped_mm"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "k", "n")
        _check_choice(self, "impl", GROUPED_IMPLS)
        counts = self.tokens_per_expert
        if not isinstance(counts, tuple) or len(counts) == 0:
            raise ValueError("GroupedGemmSpec.tokens_per_expert must be a non-empty tuple of token counts")
        if any((not isinstance(c, int)) or c < 0 for c in counts):
            raise ValueError(f"GroupedGemmSpec.tokens_per_expert must hold integers >= 0, got {counts!r}")
        if sum(counts) == 0:
            raise ValueError("GroupedGemmSpec.tokens_per_expert must route at least one token (sum >= 1)")

    @property
    def num_experts(self) -> int:
        return len(self.tokens_per_expert)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens_per_expert)

    @property
    def max_tokens(self) -> int:
        return max(self.tokens_per_expert)

    def executed_rows(self) -> int:
        """Rows the kernel actually multiplies: padded to the busiest expert for bmm."""
        if self.impl == "padded_bmm":
            return self.num_experts * self.max_tokens
        return self.total_tokens

    def flops(self) -> float:
        # Useful work: 2 * K * N * sum_e n_e (the MoE FLOPs people count). Padding is waste,
        # exposed by executed_flops() and by the padding-waste feature.
        return 2.0 * self.k * self.n * self.total_tokens

    def executed_flops(self) -> float:
        return 2.0 * self.k * self.n * self.executed_rows()

    def weight_experts(self) -> int:
        """Experts whose weight matrix the call reads: all E for a padded bmm (it multiplies
        every expert's slice, empty or not); only experts with tokens for grouped_mm, which
        skips empty groups (measured on CPU: 3 non-empty of 16 experts read 3.1 ms, all 16
        10.4 ms, K=1024, N=2048; CUTLASS grouped GEMMs schedule tiles of non-empty groups only)."""
        if self.impl == "padded_bmm":
            return self.num_experts
        return sum(1 for c in self.tokens_per_expert if c > 0)

    def bytes_moved(self) -> float:
        # Inputs read once, outputs written once, each read expert's weight once:
        # s * (rows*K + E_read*K*N + rows*N), rows = executed rows (padding included).
        rows = self.executed_rows()
        return float(self.elem_bytes * (rows * self.k + self.weight_experts() * self.k * self.n + rows * self.n))


# ----------------------------------------------------------------------------- gather / scatter

SCATTER_BACKENDS = ("index_add", "scatter_reduce", "torch_scatter", "index_copy", "index_put")
SCATTER_REDUCES = ("sum", "mean", "max", "copy")
#: which reductions each scatter backend implements
SCATTER_BACKEND_REDUCES: dict[str, tuple[str, ...]] = {
    "index_add": ("sum",),
    "scatter_reduce": ("sum", "mean", "max"),
    "torch_scatter": ("sum", "mean", "max"),
    "index_copy": ("copy",),
    # ``index_put_(..., accumulate=True)``: autograd's backward of advanced indexing. On CPU
    # it accumulates serially, 10x slower than index_add_ on the same rows (HF batched_mm's
    # weight-gradient scatter: 696 ms against 73 ms predicted as index_add)
    "index_put": ("sum",),
}


@dataclass(frozen=True)
class GatherSpec(KernelSpec):
    """out[E, F] = src[index] with index[E] in [0, num_src) (``index_select`` on rows).

    ``index_cv`` is the coefficient of variation of how often each source row is read
    (0 = every row equally often; large = a few hot rows), ``sorted`` whether the index
    is ascending.
    """

    family: ClassVar[str] = "gather"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64",)
    num_rows: int
    width: int
    num_src: int
    index_cv: float = 0.0
    sorted: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "num_rows", "width", "num_src")
        _check_cv(self, "index_cv")

    def flops(self) -> float:
        return 0.0  # pure data movement

    def bytes_moved(self) -> float:
        # E*F elements read and written, plus the E-entry int64 index read once.
        return float(2 * self.num_rows * self.width * self.elem_bytes + self.num_rows * INDEX_BYTES)

    def intensity(self) -> float:
        return 0.0


@dataclass(frozen=True)
class ScatterSpec(KernelSpec):
    """out[N, F] (reduce)= src[E, F] at index[E] in [0, num_dst).

    ``backend`` is the implementation (``index_add_``, ``scatter_reduce``, torch-scatter's
    ``scatter``, ``index_copy_`` for a plain scatter-copy, ``index_put_`` with accumulate),
    ``reduce`` the reduction,
    ``index_cv`` the coefficient of variation of destination in-degree, ``sorted``
    whether the index is ascending (destination-sorted edges).
    """

    family: ClassVar[str] = "scatter"
    num_rows: int
    width: int
    num_dst: int
    reduce: str = "sum"
    backend: str = "index_add"
    index_cv: float = 0.0
    sorted: bool = False
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "num_rows", "width", "num_dst")
        _check_choice(self, "backend", SCATTER_BACKENDS)
        _check_choice(self, "reduce", SCATTER_BACKEND_REDUCES[self.backend])
        _check_cv(self, "index_cv")
        if self.backend == "index_copy" and (self.index_cv != 0 or self.num_rows > self.num_dst):
            raise ValueError(
                "ScatterSpec with backend='index_copy' writes distinct destinations: it needs index_cv=0 "
                f"and num_rows <= num_dst, got index_cv={self.index_cv}, num_rows={self.num_rows}, num_dst={self.num_dst}"
            )

    def flops(self) -> float:
        # One add (or compare) per incoming element; a copy does no arithmetic.
        return 0.0 if self.reduce == "copy" else float(self.num_rows * self.width)

    def bytes_moved(self) -> float:
        # Read E*F source elements and the index, write the N*F destination once.
        return float(
            (self.num_rows + self.num_dst) * self.width * self.elem_bytes + self.num_rows * INDEX_BYTES
        )


@dataclass(frozen=True)
class SpmmSpec(KernelSpec):
    """out[N_dst, F] = A[N_dst, N_src] @ X[N_src, F] with A in CSR holding ``nnz`` values.

    Gather and sum-aggregation fused in one sparse-dense matmul (``torch.sparse.mm``).
    ``index_cv`` is the coefficient of variation of the CSR row lengths (in-degree).
    ``src_cv`` and ``src_read_share`` describe the column indices, i.e. which rows of X are
    read: the CV of how often each of the N_src rows is read, and the share read at least
    once. They set the kernel's cache footprint: a skewed graph (R-MAT at a = 0.7) reads
    38% of X and runs 1.4-1.6x faster than the same CSR with uniform columns (the AMD EPYC VM;
    README, "Second pass"). Left unset (None) they
    mean uniform random columns, which is what rows measured before they existed ran.
    """

    family: ClassVar[str] = "spmm"
    nnz: int
    width: int
    num_dst: int
    num_src: int
    index_cv: float = 0.0
    dtype: str = "float32"
    src_cv: float | None = None
    src_read_share: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "nnz", "width", "num_dst", "num_src")
        _check_cv(self, "index_cv")
        if (self.src_cv is None) != (self.src_read_share is None):
            raise ValueError("SpmmSpec.src_cv and SpmmSpec.src_read_share are given together or not at all, "
                             f"got src_cv={self.src_cv!r}, src_read_share={self.src_read_share!r}")
        if self.src_cv is not None:
            _check_cv(self, "src_cv")
            share = self.src_read_share
            if not isinstance(share, (int, float)) or not 0 < share <= 1:
                raise ValueError(f"SpmmSpec.src_read_share must be in (0, 1], got {share!r}")

    def columns(self) -> tuple[float, float]:
        """(src_cv, src_read_share) in effect: as given, or those of uniform random columns.

        Uniform draws of nnz columns among N_src hit each row Poisson(m) times, m = nnz/N_src:
        CV = 1/sqrt(m), and a row is read at least once with probability 1 - exp(-m)."""
        if self.src_cv is not None and self.src_read_share is not None:
            return float(self.src_cv), float(self.src_read_share)
        m = self.nnz / self.num_src
        return 1.0 / math.sqrt(m), 1.0 - math.exp(-m)

    def flops(self) -> float:
        # One multiply and one add per non-zero and feature column (standard SpMM count).
        return 2.0 * self.nnz * self.width

    def bytes_moved(self) -> float:
        # CSR values + column indices + row pointers, the rows of X that are read (once
        # each), out written once.
        csr = self.nnz * (self.elem_bytes + INDEX_BYTES) + (self.num_dst + 1) * INDEX_BYTES
        x_rows = self.columns()[1] * self.num_src
        return float(csr + (x_rows + self.num_dst) * self.width * self.elem_bytes)


# ----------------------------------------------------------------------------- small ops

#: op -> (full-size tensor inputs, FLOPs per output element). FLOPs follow the defining
#: formula with a transcendental counted as one FLOP: silu(x) = x / (1 + exp(-x)) is
#: exp, add, div, mul... counted 4; gelu(tanh form) 0.5x(1+tanh(0.797(x+0.0447x^3))) 8.
ELEMENTWISE_OPS: dict[str, tuple[int, int]] = {
    "relu": (1, 1),
    "silu": (1, 4),
    "gelu": (1, 8),
    "sigmoid": (1, 3),
    "add": (2, 1),
    "mul": (2, 1),
    "scale": (1, 1),  # x * (broadcast row/column vector or scalar)
    "floordiv": (1, 1),
    "copy": (1, 0),
    "fill": (0, 0),
}


@dataclass(frozen=True)
class ElementwiseSpec(KernelSpec):
    """out[numel] = op(inputs...), one pass over the data (activation, add, scale, fill)."""

    family: ClassVar[str] = "elementwise"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64", "int32")
    op: str
    numel: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice(self, "op", tuple(ELEMENTWISE_OPS))
        _check_positive(self, "numel")

    def flops(self) -> float:
        return float(ELEMENTWISE_OPS[self.op][1] * self.numel)

    def bytes_moved(self) -> float:
        # Each full-size input read once, the output written once (seed article 19.2.2: 6N
        # bytes for a bf16 add).
        n_inputs = ELEMENTWISE_OPS[self.op][0]
        return float((n_inputs + 1) * self.numel * self.elem_bytes)


@dataclass(frozen=True)
class SoftmaxSpec(KernelSpec):
    """Row softmax of a [rows, cols] tensor."""

    family: ClassVar[str] = "softmax"
    rows: int
    cols: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "rows", "cols")

    def flops(self) -> float:
        # Per element: max-compare, subtract, exp, sum-add, divide = 5 (online-softmax count,
        # Milakov & Gimelshein 2018).
        return 5.0 * self.rows * self.cols

    def bytes_moved(self) -> float:
        return float(2 * self.rows * self.cols * self.elem_bytes)


@dataclass(frozen=True)
class TopkSpec(KernelSpec):
    """Top-k values and indices along the last dim of a [rows, cols] tensor."""

    family: ClassVar[str] = "topk"
    rows: int
    cols: int
    k: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "rows", "cols", "k")
        if self.k > self.cols:
            raise ValueError(f"TopkSpec.k must be in [1, cols={self.cols}], got {self.k}")

    def flops(self) -> float:
        # Comparisons, not floating-point arithmetic: a heap selection does
        # ~cols*log2(k+1) compares per row; counted as FLOPs for the roofline.
        return float(self.rows * self.cols * math.log2(self.k + 1))

    def bytes_moved(self) -> float:
        return float(self.rows * self.cols * self.elem_bytes + self.rows * self.k * (self.elem_bytes + INDEX_BYTES))


@dataclass(frozen=True)
class SortSpec(KernelSpec):
    """Stable sort of n keys, returning sorted values and the permutation (``torch.sort``)."""

    family: ClassVar[str] = "sort"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64", "int32")
    n: int
    dtype: str = "int64"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "n")

    def flops(self) -> float:
        return 0.0  # comparisons and moves only

    def bytes_moved(self) -> float:
        # Keys read once; sorted keys and int64 permutation written once.
        return float(self.n * (2 * self.elem_bytes + INDEX_BYTES))

    def intensity(self) -> float:
        return 0.0


@dataclass(frozen=True)
class HistogramSpec(KernelSpec):
    """Count n int64 ids into ``bins`` bins (``torch.bincount``)."""

    family: ClassVar[str] = "histogram"
    allowed_dtypes: ClassVar[tuple[str, ...]] = ("int64",)
    n: int
    bins: int
    dtype: str = "int64"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive(self, "n", "bins")

    def flops(self) -> float:
        return 0.0  # integer increments

    def bytes_moved(self) -> float:
        return float((self.n + self.bins) * INDEX_BYTES)

    def intensity(self) -> float:
        return 0.0


ALL_SPECS: tuple[type[KernelSpec], ...] = (
    GemmSpec,
    GroupedGemmSpec,
    GatherSpec,
    ScatterSpec,
    SpmmSpec,
    ElementwiseSpec,
    SoftmaxSpec,
    TopkSpec,
    SortSpec,
    HistogramSpec,
)
