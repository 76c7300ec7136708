"""Capture the kernel trace of any callable: run it once under a ``TorchDispatchMode``.

Every aten op the callable dispatches is recorded with its input shapes, dtypes and
strides, and classified by the one registry in ``sim.capture.aten_registry``:

- ``view``: views, aliases, allocations and host reads launch no kernel and are not predicted;
- ``kernel``: mapped to a kernel descriptor (``costmodel.families``), value-dependent fields
  (tokens per expert, index statistics) read from the real tensors;
- ``absorbed``: a zero fill whose tensor the next scatter / sparse matmul writes into; the
  suite times ``zeros + index_add_`` as one scatter kernel (``costmodel.families.scatter.scatter``), so the
  fill is part of that kernel, not a second one;
- ``unmapped``: an op the registry does not know or cannot describe; never dropped: listed
  by ``CapturedTrace.unmapped()`` and predicted by the roofline fallback (its ideal bytes,
  every tensor argument read once and every output written once, a sparse one by its stored
  values and indices, over the measured
  bandwidth, plus the per-call overhead: Williams, Waterman & Patterson, CACM 2009).

Capture leaves the caller's state as it found it (``CallerState``): the tensor arguments
and, for a module (or a module's bound method), its parameters and buffers are bit-identical
afterwards, and their ``.grad`` the same objects (None stays None). The capture's own
backward starts from no grads, as the measured step does, and stops at the inputs: an input
that is part of the caller's autograd graph is detached for it.

This is the technique of PyTorch's ``FlopCounterMode`` (``torch/utils/flop_counter.py``)
and its runtime estimator (``torch/distributed/_tools/runtime_estimator.py``), with the
project's descriptors in place of FLOP formulas, so the measured cost model predicts each op.

>>> trace = capture_trace(layer, x)            # run once, record every op
>>> trace.kernels()                            # list[KernelSpec], in execution order
>>> trace.unmapped()                           # what the registry did not know
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from costmodel.families.descriptor import FLOAT_DTYPES, KernelSpec
from costmodel.families.elementwise import ElementwiseSpec
from sim.capture.aten_registry import OpCall, classify, dtype_name

OP_KINDS = ("kernel", "view", "absorbed", "unmapped")
PHASES = ("forward", "backward")


class CaptureError(RuntimeError):
    """The callable could not be captured (it raised, or it ran no kernel)."""


@dataclass
class CapturedOp:
    """One aten call: what ran, on what, and how the registry described it."""

    index: int
    aten_op: str  # e.g. "aten.mm.default"
    kind: str  # one of OP_KINDS
    phase: str  # forward | backward
    shapes: tuple[tuple[int, ...], ...]  # tensor arguments, in order
    dtypes: tuple[str, ...]
    strides: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    bytes_moved: float  # ideal traffic: each tensor argument read once, each output written once
    spec: KernelSpec | None = None
    reason: str = ""  # why unmapped


@dataclass
class CapturedTrace:
    """Every op one run of a callable dispatched, in order, with its kernel descriptor."""

    ops: list[CapturedOp]
    device: str
    capture_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def predicted_ops(self) -> list[CapturedOp]:
        """Ops that launch a kernel of their own: mapped ones and unmapped ones."""
        return [op for op in self.ops if op.kind in ("kernel", "unmapped")]

    def kernels(self, phase: str | None = None) -> list[KernelSpec]:
        """Descriptors of the mapped kernels, in execution order (optionally one phase)."""
        return [op.spec for op in self.ops
                if op.kind == "kernel" and op.spec is not None and (phase is None or op.phase == phase)]

    def table(self) -> pd.DataFrame:
        """One row per recorded op (views included), for reading and for CSV."""
        return pd.DataFrame([{
            "index": op.index, "aten_op": op.aten_op, "kind": op.kind, "phase": op.phase,
            "family": op.spec.family if op.spec is not None else "",
            "kernel": op.spec.label() if op.spec is not None else "",
            "shapes": " ".join("x".join(map(str, s)) or "scalar" for s in op.shapes),
            "dtypes": ",".join(op.dtypes), "bytes_moved": op.bytes_moved, "reason": op.reason,
        } for op in self.ops])

    def unmapped(self) -> pd.DataFrame:
        """Ops the registry did not map: name, count, distinct shapes, reason, total bytes."""
        rows: dict[str, dict[str, Any]] = {}
        for op in self.ops:
            if op.kind != "unmapped":
                continue
            row = rows.setdefault(op.aten_op, {"aten_op": op.aten_op, "count": 0, "shapes": [], "reason": op.reason,
                                               "bytes_moved": 0.0})
            row["count"] += 1
            row["bytes_moved"] += op.bytes_moved
            shape = " ".join("x".join(map(str, s)) for s in op.shapes)
            if shape not in row["shapes"] and len(row["shapes"]) < 4:
                row["shapes"].append(shape)
        frame = pd.DataFrame(list(rows.values()), columns=["aten_op", "count", "shapes", "reason", "bytes_moved"])
        frame["shapes"] = frame["shapes"].map(lambda s: "; ".join(s))
        return frame

    def float_dtypes(self) -> set[str]:
        """Floating-point dtypes the mapped kernels compute in."""
        return {op.spec.dtype for op in self.ops  # type: ignore[attr-defined]
                if op.kind == "kernel" and op.spec is not None and op.spec.dtype in FLOAT_DTYPES}  # type: ignore[attr-defined]

    def kinds_by_profiler_name(self) -> dict[str, set[str]]:
        """Profiler op name (``aten::mm``) -> the kinds its captured calls were given."""
        out: dict[str, set[str]] = {}
        for op in self.ops:
            packet = op.aten_op.split(".")[1] if op.aten_op.startswith("aten.") else op.aten_op
            out.setdefault(f"aten::{packet}", set()).add(op.kind)
        return out

    def counts(self) -> dict[str, int]:
        return {kind: sum(op.kind == kind for op in self.ops) for kind in OP_KINDS}


def _tensors(values: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten(values)
    return [v for v in flat if isinstance(v, torch.Tensor)]


_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_csc: ("ccol_indices", "row_indices"),
               torch.sparse_bsr: ("crow_indices", "col_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's data: a sparse tensor holds its stored values and their indices,
    not numel (a 100k x 100k COO with 3 non-zeros is 3 values and 3 x 2 indices)."""
    if t.layout == torch.sparse_coo:
        return t._values().numel() * t.element_size() + t._indices().numel() * t._indices().element_size()
    if t.layout in _COMPRESSED:
        compressed, plain = (getattr(t, name)() for name in _COMPRESSED[t.layout])
        return (t.values().numel() * t.element_size() + compressed.numel() * compressed.element_size()
                + plain.numel() * plain.element_size())
    return t.numel() * t.element_size()


def _ptr(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.stride()) if t.layout == torch.strided else ()


@lru_cache(maxsize=None)
def _written_args(func: Any) -> tuple[tuple[int, str, bool], ...]:
    """(position, name, keyword-only) of the arguments an aten overload writes (``Tensor(a!)``)."""
    return tuple((i, a.name, a.kwarg_only) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


class CallerState:
    """The caller's tensors as capture found them, put back bit for bit afterwards.

    Protected: the tensors among the arguments, and the parameters and buffers of ``owner``
    (a module, or the module whose bound method is captured). Their ``.grad`` are set aside
    (the capture's backward starts from none, as the measured step does) and put back, the
    same objects, None staying None. Contents are saved copy-on-write: the dispatch mode calls
    ``before`` with every op, and the first op that writes into a protected tensor's storage
    (``Tensor(a!)`` in its schema: ``x.add_(1)``, ``out=``, a view of it) first saves a copy.
    Buffers are copied up front as well, because batch norm's running statistics are updated
    by ops whose schema does not declare the write; a buffer is put back only where it changed.
    A module's parameters are not copied up front: no memory is doubled for a large model."""

    def __init__(self, owner: Any, values: Any) -> None:
        if not isinstance(owner, torch.nn.Module):
            owner = getattr(owner, "__self__", None)
        params = list(owner.parameters()) if isinstance(owner, torch.nn.Module) else []
        buffers = list(owner.buffers()) if isinstance(owner, torch.nn.Module) else []
        tensors = list({id(t): t for t in [*_tensors(values), *params, *buffers]}.values())
        self._grads = [(t, t.grad) for t in tensors if t.is_leaf]
        for t, grad in self._grads:
            if grad is not None:
                t.grad = None
        self._buffers = [(b, b.detach().clone()) for b in {id(b): b for b in buffers}.values()
                         if b.layout == torch.strided and b.device.type != "meta"]
        copied = {id(b) for b, _ in self._buffers}
        self._watch: dict[int, list[torch.Tensor]] = {}
        for t in tensors:
            p = None if id(t) in copied else _ptr(t)
            if p and t.numel() > 0:
                self._watch.setdefault(p, []).append(t)
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []

    def before(self, func: Any, args: tuple, kwargs: dict) -> None:
        """Save a copy of every protected tensor whose storage ``func`` is about to write."""
        if not self._watch:
            return
        for i, name, kwarg_only in _written_args(func):
            value = kwargs.get(name) if kwarg_only or i >= len(args) else args[i]
            for t in _tensors(value):
                for p in self._watch.pop(_ptr(t) or 0, ()):
                    self._saved.append((p, p.detach().clone()))

    def restore(self) -> None:
        """Put back every saved content and the grads as they were."""
        with torch.no_grad():
            for t, saved in self._saved:
                t.data.copy_(saved)
            for t, saved in self._buffers:
                if not _same_bits(t, saved):
                    t.data.copy_(saved)
        for t, grad in self._grads:
            t.grad = grad
        self._saved, self._buffers = [], []


class CaptureMode(TorchDispatchMode):
    """Records every aten op and classifies it through ``sim.capture.aten_registry``."""

    def __init__(self, state: CallerState | None = None) -> None:
        super().__init__()
        self.ops: list[CapturedOp] = []
        self.phase = "forward"
        self._pending_fills: dict[int, int] = {}  # storage ptr -> index of the fill that wrote it
        self._state = state

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._state is not None:
            self._state.before(func, args, kwargs)
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        call = OpCall(func, args, kwargs, out)
        kind, detail = classify(call)
        seen: set[int] = set()
        bytes_moved = 0
        for t in [*inputs, *outputs]:
            key = id(t) if _ptr(t) is None else (_ptr(t), t.numel())
            if key in seen:
                continue
            seen.add(key)  # type: ignore[arg-type]
            bytes_moved += _nbytes(t)
        op = CapturedOp(
            index=len(self.ops), aten_op=str(func), kind=kind, phase=self.phase,
            shapes=tuple(tuple(int(s) for s in t.shape) for t in inputs),
            dtypes=tuple(dtype_name(t) for t in inputs), strides=tuple(_strides(t) for t in inputs),
            out_shapes=tuple(tuple(int(s) for s in t.shape) for t in outputs),
            bytes_moved=float(bytes_moved),
            spec=detail if kind == "kernel" else None,
            reason=detail if kind == "unmapped" else "",
        )
        if kind == "view":
            self.ops.append(op)
            return
        # a pending fill is folded into the scatter that writes into it, and only into that:
        # any other kernel reading the filled tensor first makes the fill a kernel of its own
        absorbed = _ptr(call.absorbs) if call.absorbs is not None else None
        if absorbed is not None and absorbed in self._pending_fills:
            self.ops[self._pending_fills.pop(absorbed)].kind = "absorbed"
        for t in inputs:
            p = _ptr(t)
            if p is not None and p != absorbed:
                self._pending_fills.pop(p, None)
        self.ops.append(op)
        if isinstance(op.spec, ElementwiseSpec) and op.spec.op == "fill" and outputs and func.overloadpacket in _FILL_PACKETS:
            p = _ptr(outputs[0])
            if p is not None:
                self._pending_fills[p] = op.index


_FILL_PACKETS = {torch.ops.aten.zeros, torch.ops.aten.zeros_like, torch.ops.aten.zero_, torch.ops.aten.new_zeros,
                 torch.ops.aten.fill_, torch.ops.aten.full, torch.ops.aten.new_full, torch.ops.aten.full_like}


def _device_of(values: Any) -> str:
    devices = {str(t.device) for t in _tensors(values)}
    return devices.pop() if len(devices) == 1 else ("mixed: " + ", ".join(sorted(devices)) if devices else "cpu")


def capture_trace(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CapturedTrace:
    """Run ``fn(*args, **kwargs)`` once and return every op it dispatched, classified.

    Raises ``CaptureError`` (naming the exception and the fix) when ``fn`` raises, and
    when it runs no op that launches a kernel."""
    if not callable(fn):
        raise TypeError(f"capture_trace needs a callable (a module or function), got {type(fn).__name__}")
    state = CallerState(fn, (args, kwargs))
    mode = CaptureMode(state)
    start = time.perf_counter()
    try:
        with mode:
            fn(*args, **kwargs)
    except Exception as exc:
        raise CaptureError(
            f"the captured callable raised {type(exc).__name__}: {exc}. Capture runs it once on real tensors: "
            "call it yourself with the same arguments first and fix that error"
        ) from exc
    finally:
        state.restore()
    return _finish(mode, time.perf_counter() - start, _device_of((args, kwargs)))


def _finish(mode: CaptureMode, capture_s: float, device: str) -> CapturedTrace:
    trace = CapturedTrace(mode.ops, device, capture_s)
    if not trace.predicted_ops():
        raise CaptureError(
            f"the callable ran no op that launches a kernel ({len(mode.ops)} view/allocation ops only): "
            "nothing to predict; pass a callable that computes on tensors (a module's forward, a training step)"
        )
    return trace


def default_loss(output: Any) -> torch.Tensor:
    """output.float().sum() of the first floating-point tensor in the output."""
    for t in _tensors(output):
        if t.is_floating_point() and t.requires_grad:
            return t.float().sum()
    raise CaptureError(
        "backward=True needs an output tensor that requires grad: the module returned none (is it under "
        "torch.no_grad(), or are its parameters frozen?); pass loss_fn= or use backward=False"
    )


def _cut_from_graph(value: Any) -> Any:
    """An input that is an intermediate of the caller's graph, detached (still requiring grad)."""
    if isinstance(value, torch.Tensor) and value.requires_grad and not value.is_leaf:
        return value.detach().requires_grad_(True)
    return value


def capture_training_step(module: Callable[..., Any], args: tuple, kwargs: dict | None = None,
                          loss_fn: Callable[[Any], torch.Tensor] | None = None) -> CapturedTrace:
    """Capture forward, the loss, and ``loss.backward()``: ops tagged forward / backward.

    The step starts from no grads and leaves the caller's as they were (``CallerState``); an
    input inside the caller's autograd graph is detached (still requiring grad), so the
    backward ends at the inputs and the caller's graph is neither run nor freed."""
    kwargs = kwargs or {}
    state = CallerState(module, (args, kwargs))
    args, kwargs = tree_map(_cut_from_graph, (tuple(args), dict(kwargs)))
    mode = CaptureMode(state)
    start = time.perf_counter()
    try:
        with mode:
            output = module(*args, **kwargs)
            loss = (loss_fn or default_loss)(output)
            mode.phase = "backward"
            loss.backward()
    except CaptureError:
        raise
    except Exception as exc:
        raise CaptureError(
            f"the captured training step raised {type(exc).__name__}: {exc}. Capture runs forward and "
            "loss.backward() once on real tensors: run them yourself with the same arguments and fix that error"
        ) from exc
    finally:
        state.restore()
    return _finish(mode, time.perf_counter() - start, _device_of((args, kwargs)))
