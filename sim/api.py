"""Python API: predict a layer's latency without running it, or any module's from one capture.

>>> from sim.api import load_cost_model, predict_moe_latency
>>> from sim.workloads.moe_layer import MoEConfig
>>> model = load_cost_model()                    # this machine's fitted profile
>>> p = predict_moe_latency(MoEConfig(backend="padded"), model, counts=[512] * 2 + [64] * 16)
>>> p.total_s["L3"], p.kernels[["kernel", "L3"]]

Any module (a Hugging Face MoE block, a PyG convolution, a stack of layers, a training
step): ``predict_module_latency(module, args, model)`` captures its aten ops once
(``sim.capture.dispatch``), maps them through the kernel-family registry and predicts every kernel;
``coverage`` says which share of the predicted time falls on modelled families. A trace
captured on this machine can be predicted against any stored profile (another device's
fingerprint), which is how a user without the target device uses the tool;
``measure_module_latency`` times the real module and needs the profile's own device.

``load_cost_model`` measures nothing: it raises, naming the command to run, when this
device has no profile yet (``python -m costmodel bench``, or any ``python -m sim``
experiment, which calibrates on first use). The fitted models come from this user's model
cache (``costmodel.store.model_cache``), fitted from the profile's measurements on a miss; nothing
is ever unpickled from, or written into, a profile folder to predict.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from costmodel.families.aten_map import NOT_MODELLED
from costmodel.families.descriptor import KernelSpec
from costmodel.measure.allocator import configure_allocator
from costmodel.measure.device import check_dtype, check_threads, fingerprint, resolve_device
from costmodel.measure.timing import Measurement, TimingConfig
from costmodel.model.cold_start import cold_start_per_kind_s, first_of_kind
from costmodel.model.composition import composition_charges_s, per_call_s, view_charges_s
from costmodel.model.features import roofline_time_s
from costmodel.model.predictor import CostModel, LEVELS
from costmodel.store.profile import DeviceProfile
from sim.capture.dispatch import CapturedTrace, capture_trace, capture_training_step
from sim.workloads.gnn_layer import GNNConfig, GraphPlan, gnn_trace
from sim.workloads.moe_layer import DispatchPlan, MoEConfig, moe_trace
from sim.workloads.routing import Routing
from sim.predict.simulator import measure_callable, predict_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerPrediction:
    """Predicted end-to-end seconds per level and the per-kernel breakdown."""

    total_s: dict[str, float]
    kernels: pd.DataFrame
    trace: tuple[KernelSpec, ...]
    flops: float
    #: share of the predicted time (per level) on ops of modelled families; 1.0 for hand traces
    coverage: dict[str, float] = field(default_factory=dict)
    #: ops the registry did not map (aten_op, count, shapes, reason, bytes_moved), predicted by the roofline fallback
    unmapped: pd.DataFrame | None = None
    #: predicted seconds per phase (forward, backward) and level, for captured traces
    phase_s: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the capture the prediction came from (None for hand-written traces)
    captured: CapturedTrace | None = None


def load_cost_model(device: str = "auto", dtype: str = "float32", profile_root: str | Path = "profiles",
                    threads: int | None = None, allocator: str = "steady", cold_cache: bool = True, *,
                    refresh: str = "never", tolerance: float = 0.1,
                    kernels: Sequence[KernelSpec] | CapturedTrace | None = None) -> CostModel:
    """The fitted cost model of this process's device (refuses another device's).

    Every argument is checked before anything is set: ``dtype`` among the dtypes a
    profile can be measured in, ``threads`` a positive integer or None, ``refresh`` and
    ``tolerance`` as ``calibration.refresh`` / ``calibration.tolerance``.

    ``refresh="auto"`` checks the profile's freshness first, as every experiment does
    (``costmodel.measure.freshness``: a few profiled kernels per family timed now, seconds): the
    kernels of families that drifted beyond ``tolerance`` are re-measured and the models
    refitted, recorded in the profile's provenance; ``"always"`` re-measures them whatever the
    check says. Which kernels: ``kernels`` (the descriptors you are about to predict, or a
    ``CapturedTrace``; those the profile lacks are measured too), else every profiled kernel
    of the drifted families (minutes on a full profile). The returned model's ``freshness``
    says what happened. ``"never"`` (the default) measures nothing: the cached models, fitted
    on a miss.
    """
    from costmodel.measure.freshness import check_policy, check_tolerance  # noqa: PLC0415

    try:
        policy, tolerance = check_policy(refresh), check_tolerance(tolerance)
    except ValueError as err:  # the API's own argument names, not the Hydra keys
        raise ValueError(str(err).replace("calibration.", "")) from None
    if not isinstance(cold_cache, bool):  # "no" is truthy: it would load the cold profile
        raise ValueError(f"cold_cache must be True or False, got {cold_cache!r}")
    dev = resolve_device(device)
    check_dtype(dtype, dev)
    check_threads(threads)
    if isinstance(kernels, CapturedTrace):
        kernels = kernels.kernels()
    if kernels is not None and not all(isinstance(s, KernelSpec) for s in kernels):
        raise ValueError("kernels must be kernel descriptors (costmodel.families) or a CapturedTrace")
    configure_allocator(allocator)
    if threads is not None:
        torch.set_num_threads(threads)
    fp = fingerprint(dev, dtype, cold_cache=cold_cache)
    profile = DeviceProfile.open(profile_root, fp, create=False)
    if policy == "never":
        return CostModel.load(profile, expected=fp)
    from costmodel.families.descriptor import from_record  # noqa: PLC0415
    from costmodel.measure.runtime import Runtime  # noqa: PLC0415
    from sim.predict.calibration import calibrated_model  # noqa: PLC0415

    rt = Runtime.from_cfg({
        "device": str(dev), "dtype": dtype, "threads": threads, "allocator": allocator, "seed": 0,
        "profile": {"root": str(profile_root)}, "timing": {"cold_cache": cold_cache},
        "limits": {dev.type: dict(API_SIZE_LIMITS[dev.type])},
    })
    if kernels is None:
        specs = [from_record(rec) for rec in profile.kernels().to_dict("records")]
    else:
        specs = list(dict.fromkeys(kernels))
    return calibrated_model(rt, [("api", s) for s in specs], suite_name="load_cost_model", progress=True,
                            refresh=policy, tolerance=tolerance)


#: the measuring limits of conf/base.yaml, for ``load_cost_model(refresh=...)`` outside Hydra
API_SIZE_LIMITS = {"cpu": {"max_flops": 5.0e9, "max_bytes": 1.5e9, "max_call_s": 0.3},
                   "cuda": {"max_flops": 5.0e13, "max_bytes": 4.0e10, "max_call_s": 0.3}}


def load_stored_cost_model(profile_path: str | Path) -> CostModel:
    """The fitted cost model of one profile folder, of any device: how a trace captured here is
    predicted for a device this machine is not (``predict_captured(trace, model)``). The models
    come from this user's model cache, fitted from the profile's measurements on a miss; the
    folder is only read (it may be read-only or shared), and no pickle in it is ever loaded."""
    profile = DeviceProfile.load(profile_path)
    return CostModel.load(profile, expected=profile.fingerprint)


def _predict(model: CostModel, trace: list[KernelSpec], levels: Sequence[str]) -> LayerPrediction:
    kernels = predict_trace(model, trace, levels)
    return LayerPrediction(
        total_s={lv: float(kernels[lv].sum()) for lv in levels},
        kernels=kernels,
        trace=tuple(trace),
        flops=float(sum(s.flops() for s in trace)),
        coverage={lv: 1.0 for lv in levels},  # a hand-written trace lists modelled kernels only
    )


def predict_moe_latency(
    cfg: MoEConfig,
    model: CostModel,
    *,
    routing: Routing | None = None,
    counts: Sequence[int] | None = None,
    levels: Sequence[str] = LEVELS,
) -> LayerPrediction:
    """Latency of ``cfg``'s MoE layer for a routing, or just its per-expert token counts.

    ``counts`` (one whole number per expert, each in [0, tokens], summing to between 1 and
    tokens x top_k) stands for a routing whose tokens are spread evenly over the combine
    step; see ``sim.workloads.moe_layer.check_expert_counts``.
    """
    if (routing is None) == (counts is None):
        raise ValueError("give exactly one of routing= or counts=")
    if routing is not None:
        if (routing.tokens, routing.top_k, routing.num_experts) != (cfg.tokens, cfg.top_k, cfg.num_experts):
            raise ValueError(f"routing is for tokens={routing.tokens}, top_k={routing.top_k}, "
                             f"num_experts={routing.num_experts}; the layer has moe.tokens={cfg.tokens}, "
                             f"moe.top_k={cfg.top_k}, moe.num_experts={cfg.num_experts}")
        plan = DispatchPlan.from_routing(routing)
    else:
        plan = DispatchPlan.from_expert_counts(counts, cfg)  # type: ignore[arg-type]
    return _predict(model, moe_trace(cfg, plan), levels)


def predict_gnn_latency(
    cfg: GNNConfig, model: CostModel, edge_index: torch.Tensor, *, levels: Sequence[str] = LEVELS
) -> LayerPrediction:
    """Latency of ``cfg``'s GNN layer on the graph ``edge_index`` ([2, E] int64)."""
    plan = GraphPlan.from_edge_index(edge_index, cfg.num_nodes, sorted_by_dst=cfg.edge_order == "dst_sorted")
    return _predict(model, gnn_trace(cfg, plan), levels)


# ----------------------------------------------------------------------------- any module


def _check_model(model: Any) -> CostModel:
    if isinstance(model, CostModel):
        return model
    if isinstance(model, DeviceProfile):
        raise TypeError(
            f"got a device profile ({model.path}), not a fitted cost model: fit it with `python -m costmodel fit` "
            "(or CostModel.fit_profile(profile)) and pass load_cost_model(...)"
        )
    raise TypeError(f"model must be a fitted CostModel (sim.api.load_cost_model()), got {type(model).__name__}")


def _module_tensors(module: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None, *,
                    buffers: bool = True) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    tensors = [t for t in tree_flatten((list(args), dict(kwargs or {})))[0] if isinstance(t, torch.Tensor)]
    if isinstance(module, torch.nn.Module):
        tensors += list(module.parameters()) + (list(module.buffers()) if buffers else [])
    return tensors


def _check_call(args: Any, kwargs: Any) -> None:
    """``args`` a tuple or list, ``kwargs`` None or a mapping with string keys (checked before any work)."""
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__} (wrap it: (x,))")
    if kwargs is not None and not (isinstance(kwargs, Mapping) and all(isinstance(k, str) for k in kwargs)):
        raise TypeError(f"kwargs must be None or a mapping of keyword-argument names to values (a dict such as "
                        f"{{'labels': ids}}), got {type(kwargs).__name__}: {kwargs!r:.80}")


def _check_dtypes(dtypes: set[str], model: CostModel, where: str) -> None:
    other = sorted(dtypes - {model.fingerprint.dtype})
    if other:
        dt = other[0]
        raise ValueError(
            f"{where} computes in {other} but the profile was measured for {model.fingerprint.dtype} "
            f"({model.fingerprint.describe()}): measure that dtype (`python -m costmodel bench dtype={dt}` then "
            f"`python -m costmodel fit dtype={dt}`) and pass load_cost_model(dtype='{dt}'), or cast the module "
            f"and inputs to {model.fingerprint.dtype}"
        )


def _warn_not_modelled(fallback: Sequence[Any]) -> None:
    """Say plainly when the fallback predicts ops whose work it does not count (an integer
    matmul: bytes only, no multiply-adds), so the prediction underestimates them."""
    ops = sorted({op.aten_op for op in fallback if NOT_MODELLED in op.reason})
    if ops:
        n = sum(NOT_MODELLED in op.reason for op in fallback)
        reason = next(op.reason for op in fallback if NOT_MODELLED in op.reason)
        warnings.warn(f"{n} op(s) of the trace are not modelled ({', '.join(ops)}; e.g. {reason}): their prediction "
                      "is a lower bound. They are listed in the prediction's `unmapped` table", stacklevel=3)


def predict_captured(trace: CapturedTrace, model: CostModel, levels: Sequence[str] = LEVELS, *,
                     l3_factor: Callable[[str], float] | None = None) -> LayerPrediction:
    """Predict every op of a captured trace: mapped kernels by the cost model, unmapped ops
    by the roofline fallback (ideal bytes / measured bandwidth + per-call overhead, the same
    at every level; plus the cold-call overhead on a cold-cache profile, as ``predict_trace``),
    and views by the profile's host costs (rows of family ``view``: ``costmodel.model.composition``;
    0 at L0 and L1). Every op but a view also pays the per-call cost among other kinds.
    ``l3_factor`` (family -> factor: the held-out drift of ``sim.predict.heldout_drift``) multiplies
    each mapped kernel's L3 time, not these charges."""
    model = _check_model(model)
    _check_dtypes(trace.float_dtypes(), model, "the captured trace")
    ops = trace.predicted_ops()
    mapped = [op for op in ops if op.kind == "kernel"]
    fitted = set(model.meta.get("families", ()))
    missing = sorted({op.spec.family for op in mapped} - fitted) if fitted else []  # type: ignore[union-attr]
    if missing:
        raise ValueError(
            f"the trace runs kernel families {missing} that the profile's models were not fitted on "
            f"(fitted: {sorted(fitted)}): measure them first, e.g. sim.predict.calibration.calibrated_model(rt, "
            f"captured_suite([trace]), suite_name=...) or `python -m costmodel bench bench.families={missing}` "
            "then `python -m costmodel fit`"
        )
    kernels = predict_trace(model, [op.spec for op in mapped], levels, quiet=True)  # type: ignore[misc]
    if l3_factor is not None and "L3" in levels and len(kernels):
        cold = composition_charges_s(model, "L3", [op.spec for op in mapped])  # type: ignore[misc]
        kernels["L3"] = (kernels["L3"] - cold) * kernels["family"].map(l3_factor).to_numpy(dtype=np.float64) + cold
    kernels.insert(0, "aten_op", [op.aten_op for op in mapped])
    kernels.insert(1, "phase", [op.phase for op in mapped])
    kernels["modelled"] = True
    fallback = [op for op in ops if op.kind == "unmapped"]
    _warn_not_modelled(fallback)
    parts, placed = [kernels], list(mapped)
    if fallback:
        bytes_moved = np.array([op.bytes_moved for op in fallback], dtype=np.float64)
        seconds = roofline_time_s(np.zeros_like(bytes_moved), bytes_moved, model.ceilings) + per_call_s(model, "L2")
        # an op no family maps is its own kind: its first call pays the cold start
        seconds = seconds + cold_start_per_kind_s(model, "L2") * first_of_kind(op.aten_op for op in fallback)
        parts.append(pd.DataFrame({"aten_op": [op.aten_op for op in fallback], "phase": [op.phase for op in fallback],
                                   "family": "roofline_fallback", "kernel": [op.aten_op for op in fallback], "flops": 0.0,
                                   **{lv: seconds for lv in levels}, "modelled": False}))
        placed += fallback
    views = [op for op in trace.ops if op.kind == "view"]
    view_s = {lv: view_charges_s(model, lv, [op.aten_op for op in views]) for lv in levels}
    if any(v.any() for v in view_s.values()):  # a profile with host costs: every view is a row
        parts.append(pd.DataFrame({"aten_op": [op.aten_op for op in views], "phase": [op.phase for op in views],
                                   "family": "view", "kernel": [op.aten_op for op in views], "flops": 0.0,
                                   **view_s, "modelled": True}))
        placed += views
    if len(parts) > 1:  # in execution order
        order = {op.index: i for i, op in enumerate(placed)}
        kernels = pd.concat(parts, ignore_index=True)
        kernels = kernels.iloc[[order[op.index] for op in trace.ops if op.index in order]].reset_index(drop=True)
    total = {lv: float(kernels[lv].sum()) for lv in levels}
    coverage = {lv: float(kernels.loc[kernels["modelled"], lv].sum()) / total[lv] if total[lv] > 0 else 1.0
                for lv in levels}
    phases = {ph: {lv: float(kernels.loc[kernels["phase"] == ph, lv].sum()) for lv in levels}
              for ph in kernels["phase"].unique()}
    specs = tuple(op.spec for op in mapped)  # type: ignore[misc]
    return LayerPrediction(total_s=total, kernels=kernels, trace=specs, flops=float(sum(s.flops() for s in specs)),
                           coverage=coverage, unmapped=trace.unmapped(), phase_s=phases, captured=trace)


def capture_module(module: Callable[..., Any], args: Sequence[Any], kwargs: dict | None = None, *,
                   backward: bool = False, loss_fn: Callable[[Any], torch.Tensor] | None = None) -> CapturedTrace:
    """Capture one forward call (or forward + loss + backward) of ``module``.

    The backward starts from no grads, as the measured step does; the module's parameters,
    grads and buffers and the inputs are left as they were (``sim.capture.dispatch.CallerState``)."""
    _check_call(args, kwargs)
    if backward:
        return capture_training_step(module, tuple(args), dict(kwargs or {}), loss_fn)
    return capture_trace(module, *args, **dict(kwargs or {}))


def predict_module_latency(
    module: Callable[..., Any],
    args: Sequence[Any],
    model: CostModel,
    kwargs: dict | None = None,
    backward: bool = False,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    levels: Sequence[str] = LEVELS,
) -> LayerPrediction:
    """Predicted latency of ``module(*args, **kwargs)`` (plus ``loss.backward()`` with
    ``backward=True``; loss = ``loss_fn(output)`` or ``output.float().sum()``).

    The module runs once on real tensors (capture), on whatever device they live on; the
    prediction is for ``model``'s device, which may be another one."""
    model = _check_model(model)
    _check_call(args, kwargs)
    # refused before running anything: the dtypes of the inputs and parameters. Buffers are left
    # to the trace (predict_captured checks the dtypes the kernels compute in): an unused float64
    # buffer, or one only read by host-side code, does not make the module compute in float64.
    float_dtypes = {str(t.dtype).removeprefix("torch.") for t in _module_tensors(module, args, kwargs, buffers=False)
                    if t.is_floating_point()}
    _check_dtypes(float_dtypes, model, "the module")
    trace = capture_module(module, args, kwargs, backward=backward, loss_fn=loss_fn)
    if trace.device.split(":")[0] != model.fingerprint.device_kind:
        log.info("predicting a trace captured on %s for the profile of %s", trace.device, model.fingerprint.describe())
    return predict_captured(trace, model, levels)


def _check_same_device(module: Any, args: Sequence[Any], kwargs: dict | None, model: CostModel) -> torch.device:
    devices = {t.device for t in _module_tensors(module, args, kwargs)}
    if len(devices) > 1:
        raise ValueError(f"the module and its inputs live on several devices {sorted(map(str, devices))}: "
                         "move them to one (module.to(device), x.to(device))")
    device = devices.pop() if devices else torch.device("cpu")
    if device.type != model.fingerprint.device_kind:
        raise ValueError(
            f"the module runs on {device} but the profile is for {model.fingerprint.device_kind} "
            f"({model.fingerprint.describe()}): measuring needs the profile's own device; move the module and "
            f"inputs there, or load this device's profile (load_cost_model(device='{device.type}')). "
            "Predicting alone (predict_module_latency) works across devices"
        )
    return device


@dataclass(frozen=True)
class ModuleMeasurement:
    """Measured latency of a module's forward and, for a training step, forward + backward."""

    forward: Measurement
    step: Measurement | None = None

    @property
    def backward_s(self) -> float | None:
        return None if self.step is None else max(self.step.median_s - self.forward.median_s, 0.0)


def measure_module_latency(
    module: Callable[..., Any], args: Sequence[Any], model: CostModel, kwargs: dict | None = None,
    backward: bool = False, *, loss_fn: Callable[[Any], torch.Tensor] | None = None,
    timing: TimingConfig | None = None,
) -> ModuleMeasurement:
    """Time the real module on the profile's device (refuses another device), the forward
    alone and, with ``backward=True``, the whole step (grads reset before every call)."""
    from sim.capture.dispatch import default_loss

    model = _check_model(model)
    _check_call(args, kwargs)
    device = _check_same_device(module, args, kwargs, model)
    timing = timing or TimingConfig(cold_cache=model.fingerprint.cache == "cold")
    kwargs = kwargs or {}
    forward = measure_callable(lambda: module(*args, **kwargs), device, timing)
    if not backward:
        return ModuleMeasurement(forward)
    loss = loss_fn or default_loss

    def step() -> None:
        if isinstance(module, torch.nn.Module):
            module.zero_grad(set_to_none=True)
        loss(module(*args, **kwargs)).backward()

    return ModuleMeasurement(forward, measure_callable(step, device, timing))
