"""Kernel descriptors: the stable import point for every family's descriptor and constants.

Each family is defined in its own module of ``costmodel.families`` (descriptor, suite grid,
runner, features, aten mapping); the conventions every descriptor follows (``flops()``,
ideal ``bytes_moved()``, ``intensity()``, validation on construction, with their sources)
are in ``costmodel.families.descriptor``.
"""

from __future__ import annotations

from costmodel.families.descriptor import (  # noqa: F401
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
