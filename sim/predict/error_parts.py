"""Where a held-out prediction's error comes from, kernel kind by kernel kind.

A held-out L3 error has three parts (``docs/method.md``, "How a prediction is scored"):

- **the kernel regression on shapes it never saw**: the held-out models' seconds for the
  layers' kernels against the profile's own measurements of the same kernels, as loaded
  before the run (both from the profile: no drift, no composition);
- **drift**: the same kernels timed now, by their runners in the same rounds as the layers
  (``calibration.paired``), against those profiled seconds: the machine's speed now against
  when the profile was measured;
- **composition**: what a layer pays beyond its kernels (the replay score: layers against
  their kernels timed beside them plus the cold-call chain).

``heldout_error_parts`` gives the first two per kernel kind (family plus the field that
picks the aten op: ``elementwise/add``, ``grouped_gemm/padded_bmm``), weighted by how often
the traces call each kernel, and their product, held out against timed now, so a run says
which kinds its held-out error sits in and whether it is the regression or the machine.
The regression and drift parts cover the kernels the profile had before the run (a kernel
it never measured has no profiled seconds; ``profiled_calls`` counts the covered calls).
Every side leaves out the per-call host cost and the cold start of each kind
(``costmodel.model.composition``): they belong to composition, and the runners' timings do not pay them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np

from costmodel.families.descriptor import KernelSpec
from costmodel.model.predictor import CostModel
from costmodel.model.cold_start import kernel_kind
from costmodel.model.composition import composition_charges_s
from sim.predict.simulator import predict_trace

#: kinds below this share of the layers' summed replayed kernel seconds are pooled as "other"
MIN_KIND_SHARE = 0.01
#: rounding of the ratios and shares written into summary.json
DIGITS = 3


def timed_kernels(jobs: Sequence[Any], timings: Sequence[Mapping[str, Any]]) -> dict[KernelSpec, float]:
    """Descriptor -> median seconds of the paired kernel jobs (``sim.predict.paired.kernel_jobs``)
    from their timings (``measure_interleaved``'s results for those jobs, in the same order)."""
    if len(jobs) != len(timings):
        raise ValueError(f"{len(jobs)} kernel jobs but {len(timings)} timings")
    return {job.spec: float(t["measured_s"]) for job, t in zip(jobs, timings)}


def heldout_error_parts(traces: Sequence[Sequence[KernelSpec]], heldout_model: CostModel,
                        kernel_s: Mapping[KernelSpec, float], layers_measured_s: float,
                        profiled_s: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Per kernel kind of ``traces``: calls, held-out L3 kernel seconds, the same kernels'
    seconds timed beside the layers (``kernel_s``: descriptor -> median seconds), their ratio
    (``heldout_over_replay``) and the kind's share of the layers' measured seconds
    (``layers_measured_s``, summed over the traces' layers). With ``profiled_s`` (kernel key ->
    the profile's seconds as loaded before the run: ``CostModel.measured_s``), over the calls
    of kernels it holds: ``heldout_over_profiled`` (the regression part) and
    ``replay_over_profiled`` (the drift part). Kinds under ``MIN_KIND_SHARE`` of the replayed
    seconds are pooled as ``other``; the whole is under ``all``. Kernels without a timing are
    left out and counted."""
    if layers_measured_s <= 0:
        raise ValueError(f"layers_measured_s must be > 0 seconds, got {layers_measured_s}")
    profiled_s = profiled_s or {}
    calls = Counter(s for trace in traces for s in trace)
    timed = [s for s in calls if s in kernel_s and np.isfinite(kernel_s[s]) and kernel_s[s] > 0]
    timed_set = set(timed)
    untimed = sum(n for s, n in calls.items() if s not in timed_set)
    if not timed:
        return {"kinds": {}, "all": None, "untimed_calls": int(untimed)}
    predicted = predict_trace(heldout_model, timed, ["L3"], quiet=True)["L3"].to_numpy(dtype=np.float64)
    predicted = predicted - composition_charges_s(heldout_model, "L3", timed)
    #: per kind: calls, held-out s, timed s, then over the profiled calls: calls, held-out s, timed s, profiled s
    sums: dict[str, np.ndarray] = {}
    for spec, pred in zip(timed, predicted):
        n, now = calls[spec], float(kernel_s[spec])
        was = profiled_s.get(spec.key())
        covered = [n, n * float(pred), n * now, n * float(was)] if was is not None and was > 0 else [0, 0, 0, 0]
        acc = sums.setdefault(kernel_kind(spec), np.zeros(7))
        acc += np.array([n, n * float(pred), n * now, *covered])
    replay_total = sum(v[2] for v in sums.values())
    kinds: dict[str, dict[str, Any]] = {}
    other = np.zeros(7)
    for kind, acc in sorted(sums.items(), key=lambda kv: -kv[1][2]):
        if acc[2] < MIN_KIND_SHARE * replay_total:
            other += acc
            continue
        kinds[kind] = _entry(acc, layers_measured_s)
    if other[0]:
        kinds["other"] = _entry(other, layers_measured_s)
    return {"kinds": kinds, "all": _entry(sum(sums.values()), layers_measured_s), "untimed_calls": int(untimed)}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, DIGITS) if b > 0 else None


def _entry(acc: np.ndarray, layers_s: float) -> dict[str, Any]:
    calls, heldout_s, replay_s, p_calls, p_heldout_s, p_replay_s, profiled_s = (float(v) for v in acc)
    return {"calls": int(calls), "heldout_s": heldout_s, "replay_s": replay_s,
            "heldout_over_replay": _ratio(heldout_s, replay_s),
            "share_of_layers_pct": round(100 * replay_s / layers_s, 1),
            "profiled_calls": int(p_calls),
            "heldout_over_profiled": _ratio(p_heldout_s, profiled_s),
            "replay_over_profiled": _ratio(p_replay_s, profiled_s)}


def describe(parts: Mapping[str, Any], top: int = 5) -> str:
    """One line: the whole ratios and the kinds holding the most replayed seconds."""
    whole = parts.get("all")
    if not whole:
        return "held-out error by kernel kind: no kernel of the traces was timed beside the layers"

    def split(v: Mapping[str, Any]) -> str:  # parentheses, not brackets: the console reads [..] as markup
        if v["heldout_over_profiled"] is None:
            return ""
        return f"regression {v['heldout_over_profiled']:.2f}x, drift {v['replay_over_profiled']:.2f}x; "
    kinds = ", ".join(f"{k} {v['heldout_over_replay']:.2f}x ({split(v)}{v['share_of_layers_pct']:.0f}% of the layers)"
                      for k, v in list(parts["kinds"].items())[:top] if v["heldout_over_replay"] is not None)
    whole_split = f" ({split(whole).removesuffix('; ')})" if split(whole) else ""
    return (f"held-out kernel seconds / the same kernels timed beside the layers: {whole['heldout_over_replay']:.2f}x"
            f"{whole_split} over all kinds (regression: held out / profiled, drift: timed now / profiled, over the "
            "kernels the profile held); "
            f"by kind: {kinds}")
