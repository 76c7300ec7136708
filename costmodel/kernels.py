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

Each family is defined in its own module of ``costmodel.families`` (descriptor, runner,
features, aten mapping); this module is the stable import point for all of them.
"""

from __future__ import annotations

from costmodel.families.descriptor import (  # noqa: F401
    _REGISTRY,
    DTYPE_BYTES,
    FLOAT_DTYPES,
    INDEX_BYTES,
    OPTIONAL_TYPES,
    KernelSpec,
    families,
    from_record,
    optional_fields,
    record_value,
    spec_class,
)
from costmodel.families.elementwise import ELEMENTWISE_OPS, ElementwiseSpec  # noqa: F401
from costmodel.families.gather import GatherSpec  # noqa: F401
from costmodel.families.gemm import GemmSpec  # noqa: F401
from costmodel.families.grouped_gemm import GROUPED_IMPLS, GroupedGemmSpec  # noqa: F401
from costmodel.families.histogram import HistogramSpec  # noqa: F401
from costmodel.families.registry import registered
from costmodel.families.scatter import (  # noqa: F401
    SCATTER_BACKEND_REDUCES,
    SCATTER_BACKENDS,
    SCATTER_REDUCES,
    ScatterSpec,
)
from costmodel.families.softmax import SoftmaxSpec  # noqa: F401
from costmodel.families.sort import SortSpec  # noqa: F401
from costmodel.families.spmm import SpmmSpec  # noqa: F401
from costmodel.families.topk import TopkSpec  # noqa: F401

#: every registered descriptor class
ALL_SPECS: tuple[type[KernelSpec], ...] = tuple(f.spec for f in registered())
