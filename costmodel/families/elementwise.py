"""Elementwise: one pass over the data (activations, add, scale, copies, fills, reductions
along a dimension), and the nearest-family home of every pointwise aten op, copy, fill and
reduction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from costmodel.families.aten_map import Entry, OpCall, Unmappable, aten, dtype_name, register, spec_dtype
from costmodel.families.columns import column, integer_dtype, log10, onehot
from costmodel.families.descriptor import FLOAT_DTYPES, KernelSpec, check_choice, check_positive
from costmodel.families.inputs import randn
from costmodel.families.registry import SuiteContext, grid, register_family


# ----------------------------------------------------------------------------- descriptor


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
    # reductions of ``reduced`` elements into each output: one add (or compare) per input element
    "reduce_inner": (1, 1),  # along the innermost, contiguous dimension: x.sum(-1)
    "reduce_outer": (1, 1),  # across rows, each output strided through memory: x.sum(0)
}

#: the ops that reduce ``reduced`` input elements into each output
REDUCE_OPS = ("reduce_inner", "reduce_outer")


@dataclass(frozen=True)
class ElementwiseSpec(KernelSpec):
    """out[numel] = op(inputs...), one pass over the data (activation, add, scale, fill); for a
    reduction (``REDUCE_OPS``) ``numel`` is the input's and ``reduced`` the elements summed into
    each of the ``numel / reduced`` outputs."""

    family: ClassVar[str] = "elementwise"
    allowed_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES + ("int64", "int32")
    op: str
    numel: int
    dtype: str = "float32"
    reduced: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self, "op", tuple(ELEMENTWISE_OPS))
        check_positive(self, "numel")
        if self.op in REDUCE_OPS:
            if self.reduced is None or self.reduced < 1 or self.numel % self.reduced:
                raise ValueError(f"{type(self).__name__}.reduced must be an integer >= 1 dividing numel="
                                 f"{self.numel} for op {self.op}, got {self.reduced!r}")
        elif self.reduced is not None:
            raise ValueError(f"{type(self).__name__}.reduced is only for the ops {list(REDUCE_OPS)}, "
                             f"got reduced={self.reduced!r} with op {self.op}")

    @property
    def out_numel(self) -> int:
        return self.numel // self.reduced if self.reduced else self.numel

    def flops(self) -> float:
        return float(ELEMENTWISE_OPS[self.op][1] * self.numel)

    def bytes_moved(self) -> float:
        # Each full-size input read once, the output written once (seed article 19.2.2: 6N
        # bytes for a bf16 add); a reduction writes numel / reduced outputs.
        n_inputs = ELEMENTWISE_OPS[self.op][0]
        return float((n_inputs * self.numel + self.out_numel) * self.elem_bytes)


# ----------------------------------------------------------------------------- suite


def suite(cfg: Mapping[str, Any], ctx: SuiteContext) -> list[tuple[str, KernelSpec]]:
    """Op x numel (floordiv on int64 ids, as the MoE dispatch uses it); a reduction op once per
    entry of the list ``reduced`` that divides numel."""
    out: list[tuple[str, KernelSpec]] = []
    for op, numel in grid(cfg, "op", "numel"):
        if op in REDUCE_OPS:
            out += [("grid", ElementwiseSpec(op, numel, ctx.dtype, int(r))) for (r,) in grid(cfg, "reduced")
                    if numel % int(r) == 0]
        else:
            out.append(("grid", ElementwiseSpec(op, numel, "int64" if op == "floordiv" else ctx.dtype)))
    return out


# ----------------------------------------------------------------------------- torch call

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "silu": F.silu,
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "copy": torch.clone,
}


def elementwise(op: str, *inputs: torch.Tensor) -> torch.Tensor:
    """One elementwise pass; ``scale`` multiplies by a broadcast (e.g. [rows, 1]) tensor; a
    reduction sums its 2-D input along the last dimension (``reduce_inner``) or the first."""
    if op in _ACTIVATIONS:
        return _ACTIVATIONS[op](inputs[0])
    if op == "add":
        return inputs[0] + inputs[1]
    if op in ("mul", "scale"):
        return inputs[0] * inputs[1]
    if op == "floordiv":
        return torch.div(inputs[0], inputs[1], rounding_mode="floor")
    if op == "fill":
        return torch.zeros_like(inputs[0])
    if op in REDUCE_OPS:
        return inputs[0].sum(dim=-1 if op == "reduce_inner" else 0)
    raise ValueError(f"unknown elementwise op {op!r}")


# ----------------------------------------------------------------------------- runner


def build(spec: ElementwiseSpec, device: torch.device, gen: torch.Generator,
          seed: int) -> tuple[Callable[..., Any], tuple]:
    n_inputs = ELEMENTWISE_OPS[spec.op][0]
    if spec.dtype in ("int64", "int32"):
        x = torch.randint(0, 1 << 20, (spec.numel,), generator=gen).to(device=device, dtype=getattr(torch, spec.dtype))
        second: Any = 7
    else:
        x = randn((spec.numel,), spec.dtype, device, gen)
        second = randn((spec.numel,), spec.dtype, device, gen) if n_inputs == 2 else randn((1,), spec.dtype, device, gen)
    op = spec.op
    if op in REDUCE_OPS:
        # [outputs, reduced] summed along its rows, or [reduced, outputs] down its columns
        shape = (spec.out_numel, spec.reduced) if op == "reduce_inner" else (spec.reduced, spec.out_numel)

        def run_reduction(a: torch.Tensor) -> torch.Tensor:
            return elementwise(op, a.view(shape))

        return run_reduction, (x,)

    def run_elementwise(a: Any, b: Any) -> torch.Tensor:
        return elementwise(op, a, b)

    return run_elementwise, (x, second)


# ----------------------------------------------------------------------------- features


def features(t: pd.DataFrame, ceilings: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Its size, op kind, whether its data are integers (integer ops take other vector
    kernels: AVX2 has no 64-bit integer multiply, and floor division is scalar), and for a
    reduction the elements reduced into each output (``log_reduced``, 0 for the other ops):
    ATen's sum along a short innermost dimension runs a reduction per output (on the EPYC VM
    8.4M elements took 6.4 ms summed 8 at a time and 2.2 ms 1,024 at a time).

    Chosen by held-out error (4-fold by shape, two fold seeds) and extrapolation error: with
    ``int_dtype`` the Intel profile's elementwise median went 12.4 / 10.7 -> 11.9 / 10.3% and
    EPYC's p90 43 / 47 -> 39 / 44%, its extrapolation median 33 -> 24%. A flag for ATen's thread
    split at GRAIN_SIZE (TensorIterator's ``for_each``) moved the held-out medians by half a point at
    most, and the Intel extrapolation from 11.5 to 16-18%: it is not used."""
    return {"log_numel": log10(column(t, "numel")), **onehot(t["op"], tuple(ELEMENTWISE_OPS), "op"),
            "int_dtype": integer_dtype(t), "log_reduced": log10(_reduced(t))}


def _reduced(t: pd.DataFrame) -> np.ndarray:
    """Elements reduced into each output: 1 for every op but a reduction (and for tables from
    before the field existed)."""
    if "reduced" not in t.columns:
        return np.ones(len(t))
    return np.nan_to_num(pd.to_numeric(t["reduced"], errors="coerce").to_numpy(dtype=np.float64), nan=1.0)


# ----------------------------------------------------------------------------- aten ops


@register([aten.scatter_, aten.scatter], family="elementwise",
          note="nearest family: a plain scatter (one_hot, masks) writes index.numel() elements: an "
               "elementwise copy of that many")
def _scatter_plain(call: OpCall) -> KernelSpec:
    dest, index = call.args[0], call.args[2]
    return ElementwiseSpec("copy", max(int(index.numel()), 1), spec_dtype(dest, ElementwiseSpec.allowed_dtypes))


def _out_numel(call: OpCall) -> int:
    out = call.first_out
    if out is None:
        out = call.args[0]
    return max(int(out.numel()), 1)


def _elementwise(op: str, call: OpCall, dtype_from: torch.Tensor | None = None) -> KernelSpec:
    ref = dtype_from if dtype_from is not None else (call.first_out if call.first_out is not None else call.args[0])
    return ElementwiseSpec(op, _out_numel(call), spec_dtype(ref, ElementwiseSpec.allowed_dtypes))


@register([aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.full, aten.full_like, aten.fill_,
           aten.fill, aten.zero_, aten.new_zeros, aten.new_ones, aten.new_full, aten.arange,
           aten.scalar_tensor],
          family="elementwise", note="op fill; a fill consumed by the next scatter or spmm into the same tensor "
                                     "is folded into that kernel (the suite times them together)")
def _fill(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.clone, aten._to_copy, aten.copy_, aten.copy, aten.repeat, aten.cat, aten.stack, aten.flip, aten.roll,
           aten.constant_pad_nd, aten.tril, aten.triu, aten.masked_fill, aten.masked_fill_],
          family="elementwise", note="op copy (one read, one write); dtype conversions, cat, repeat, pad, "
                                     "masked_fill as the nearest copy")
def _copy(call: OpCall) -> KernelSpec:
    return _elementwise("copy", call)


@register([aten.slice_backward, aten.select_backward], family="elementwise",
          note="op fill of the output numel: the pass that zeroes the full-size gradient dominates (the "
               "slice copied into it is 1/E of it for one expert's weight slice); a copy of the output numel "
               "would read a full-size input that does not exist (2x: eager MoE backward)")
def _slice_backward(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.nll_loss_backward], family="elementwise",
          note="nearest: writes the zeroed [N, C] input gradient: op fill of N*C")
def _nll_backward(call: OpCall) -> KernelSpec:
    return _elementwise("fill", call)


@register([aten.cumsum, aten.cumprod], family="elementwise", note="nearest: op scale (one input read, one FLOP per element)")
def _cumsum(call: OpCall) -> KernelSpec:
    return _elementwise("scale", call)


@register([aten.nonzero], family="elementwise",
          note="nearest: op copy over the input (one read pass, indices written); output size is value-dependent")
def _nonzero(call: OpCall) -> KernelSpec:
    x = call.args[0]
    dt = dtype_name(x) if dtype_name(x) in ElementwiseSpec.allowed_dtypes else "int64"
    return ElementwiseSpec("copy", max(int(x.numel()), 1), dt)


@register([aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.argmax, aten.argmin, aten.prod,
           aten.norm, aten.linalg_vector_norm, aten.var, aten.std, aten.var_mean, aten.any, aten.all,
           aten.logsumexp, aten.aminmax, aten.count_nonzero],
          family="elementwise", note="a reduction over dims: op reduce_inner when the reduced dims are the "
                                     "innermost of a contiguous input (x.sum(-1), a full reduction), else "
                                     "reduce_outer (x.sum(0), a bias gradient); reduced = the elements per output")
def _reduction(call: OpCall) -> KernelSpec:
    x = call.args[0]
    dt = dtype_name(x)
    if dt == "bool":
        dt = "int64" if x.numel() < 8 else dt  # a tiny mask: nearest int dtype (size barely matters)
    if dt not in ElementwiseSpec.allowed_dtypes:
        raise Unmappable(f"dtype {dt} is not one of the family's dtypes")
    op, reduced = reduction_shape(x, reduced_dims(call))
    return ElementwiseSpec(op, max(int(x.numel()), 1), dt, reduced)


def reduced_dims(call: OpCall) -> tuple[int, ...] | None:
    """The dims a reduction call reduces, non-negative; None for all of them (no ``dim``)."""
    x = call.args[0]
    names = [a.name for a in getattr(getattr(call.func, "_schema", None), "arguments", ())]
    # the overload's own argument named dim (norm and vector_norm take p / ord before it)
    dim = call.arg(names.index("dim"), "dim") if "dim" in names else None
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(int(d) for d in dim)
    ndim = max(x.dim(), 1)
    return tuple(sorted({d % ndim for d in dims}))


def reduction_shape(x: torch.Tensor, dims: tuple[int, ...] | None) -> tuple[str, int]:
    """(op, reduced) of reducing ``x`` over ``dims`` (None: all): inner when the dims are the
    trailing ones of a contiguous tensor, else outer."""
    numel = max(int(x.numel()), 1)
    if dims is None or x.dim() == 0:
        return "reduce_inner", numel
    reduced = int(np.prod([x.shape[d] for d in dims])) if x.numel() else 1
    trailing = dims == tuple(range(x.dim() - len(dims), x.dim()))
    return ("reduce_inner" if trailing and x.is_contiguous() else "reduce_outer"), max(reduced, 1)


@register([aten.floor_divide, aten.remainder], family="elementwise", note="op floordiv (one full input)")
def _floordiv(call: OpCall) -> KernelSpec:
    ref = call.args[0]
    return _elementwise("floordiv", call, dtype_from=ref if dtype_name(ref) in ElementwiseSpec.allowed_dtypes else None)


# pointwise ops: classified by name into the nearest ElementwiseSpec op
_UNARY_NAMED = {"relu": "relu", "silu": "silu", "gelu": "gelu", "sigmoid": "sigmoid"}


_TRANSCENDENTAL = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "erf", "erfc", "erfinv",
                   "rsqrt", "sqrt", "sin", "cos", "tan", "pow", "reciprocal", "softplus", "elu", "mish",
                   "hardswish", "hardsigmoid", "leaky_relu", "logit", "atan", "asin", "acos", "sinh", "cosh",
                   "sign", "sgn", "lgamma", "digamma"}


_ADD_LIKE = {"add", "sub", "rsub", "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge",
             "bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor", "remainder",
             "fmod", "atan2", "hypot", "copysign", "threshold"}


_MUL_LIKE = {"mul", "div", "true_divide", "floor_divide", "xlogy"}


def _pointwise_op(name: str, call: OpCall) -> str:
    """The nearest ElementwiseSpec op for a pointwise aten op."""
    base = name.rstrip("_")
    tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
    out_numel = _out_numel(call)
    full = [t for t in tensors if t.numel() == out_numel]
    if base in _UNARY_NAMED:
        return _UNARY_NAMED[base]
    if base.endswith("_backward"):
        return "mul" if len(full) >= 2 else "scale"
    if base in ("where", "addcmul", "addcdiv", "lerp", "clamp", "clip") and len(full) >= 2:
        return "add"  # ternary: nearest with two full-size inputs (a third, often smaller, is not counted)
    if len(tensors) <= 1 or len(full) <= 1:
        if base in _TRANSCENDENTAL:
            return "sigmoid"  # one input, a few FLOPs (a transcendental counted as one)
        return "scale" if len(tensors) == 2 or base in _MUL_LIKE | _ADD_LIKE else "relu"
    if base in _MUL_LIKE:
        return "mul"
    return "add"


class _PointwiseMapper:
    def __call__(self, call: OpCall) -> KernelSpec:
        name = call.func.overloadpacket.__name__
        tensors = [a for a in call.args if isinstance(a, torch.Tensor)]
        allowed = ElementwiseSpec.allowed_dtypes
        # the compute dtype: a float input first (comparisons write bool), else any input the family knows
        ref = next((t for t in tensors if t.is_floating_point() and dtype_name(t) in allowed), None)
        ref = ref if ref is not None else next((t for t in tensors if dtype_name(t) in allowed), None)
        return _elementwise(_pointwise_op(name, call), call, dtype_from=ref)


POINTWISE_NOTE = ("any op tagged torch.Tag.pointwise: relu/silu/gelu/sigmoid by name; other transcendental unary "
                  "ops as sigmoid; binary ops as add or mul (both inputs full size) or scale (one broadcast); "
                  "ternary (where, addcmul, lerp) as add (nearest: the third input is not counted); "
                  "*_backward ops as mul; comparisons counted in the input's float dtype")


_POINTWISE = _PointwiseMapper()


def pointwise_entry(func: Any) -> Entry | None:
    """Registry entry for ops tagged pointwise by PyTorch (native_functions.yaml tags)."""
    if torch.Tag.pointwise in getattr(func, "tags", ()):
        return Entry("elementwise", _POINTWISE, POINTWISE_NOTE)
    return None


_BACKWARD_POINTWISE = [getattr(aten, n) for n in ("threshold_backward", "silu_backward", "gelu_backward",
                                                  "sigmoid_backward", "tanh_backward", "hardswish_backward",
                                                  "leaky_relu_backward", "elu_backward") if hasattr(aten, n)]


register(_BACKWARD_POINTWISE, family="elementwise", note=POINTWISE_NOTE)(_POINTWISE)


register_family(ElementwiseSpec, suite=suite, build=build, features=features,
                range_features=("log_numel",))
