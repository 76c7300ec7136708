"""Predict workloads, measure them, compare.

Every experiment builds a list of ``sim.workloads.workload.Workload`` (a layer or a bare
kernel: its name, its kernel trace, a zero-argument callable that runs it (None when the
experiment only predicts, measure=false) and descriptive columns), then
``evaluate_workloads`` predicts each trace with every cost-model level, measures every
callable in interleaved rounds and returns one tidy row per workload (its name in the
``label`` column) with the APE of every level.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from costmodel.families.descriptor import KernelSpec
from costmodel.measure.timing import TimingConfig
from costmodel.model.predictor import CostModel, LEVELS
from experiments.common import add_errors, console, l3_over_measured, measure_interleaved, paired_enabled, print_table
from sim.predict.calibration import DriftReference, drift_summary
from sim.predict.heldout_drift import drift_scaled_l3
from sim.predict.simulator import per_kernel_errors, predict_trace, profile_kernels, summarise_kernels
from sim.workloads.workload import Workload


def predict_workloads(model: CostModel, workloads: Sequence[Workload],
                      l3_factor: Callable[[str], float] | None = None) -> pd.DataFrame:
    """Every level's prediction of every workload; ``l3_factor`` (family -> factor, the
    held-out drift of ``sim.predict.heldout_drift``) multiplies each kernel's L3 time, not the
    cold start of its kind (``costmodel.model.cold_start``)."""
    rows = []
    for w in workloads:
        pred = predict_trace(model, w.trace, quiet=True)
        if l3_factor is not None and len(pred):
            pred["L3"] = drift_scaled_l3(model, w.trace, pred, l3_factor)
        rows.append({"label": w.name, **w.columns, "flops": w.flops, "bytes_moved": w.bytes_moved,
                     "kernels": len(w.trace), **{f"pred_{lv}_s": float(pred[lv].sum()) for lv in LEVELS}})
    return pd.DataFrame(rows)


@dataclass
class Pairing:
    """``calibration.paired``: time the workloads' distinct kernels in the same rounds as the
    workloads, write them into ``profile`` and refit before predicting (``sim.predict.paired``).
    After ``evaluate_workloads``, ``model`` is the refitted model (use it for what follows)
    and ``result`` what was written."""

    profile: Any  # costmodel.store.profile.DeviceProfile
    suite: str
    cv_folds: int = 4
    model: CostModel | None = None
    result: Any = None  # sim.predict.paired.PairedResult

    def finish(self, model: CostModel, jobs: Sequence[Any], kernels_timed: Sequence[dict[str, Any]],
               repredict: Callable[[CostModel], pd.DataFrame], measured: pd.DataFrame, wall_s: float,
               chain_timed: Sequence[dict[str, Any]] = ()) -> pd.DataFrame:
        """After the interleaved rounds: write the kernels' timings (and, with ``chain_timed``,
        the cold and the warm chain's, ``cold_chain_jobs``) into the profile, refit, and
        return the replay table: the workloads predicted again by the refitted model
        (``repredict``) beside ``measured``, with ``attrs["paired"]`` saying what was written.
        The refitted model looks the timed kernels up: replay is the composition check
        (what a layer pays beyond the kernels it is made of), not a prediction."""
        from sim.predict.paired import record_cold_chain, record_paired, refit  # noqa: PLC0415 (sim.predict.paired imports the bench)

        self.result = record_paired(self.profile, jobs, [t["rounds"] for t in kernels_timed], suite=self.suite)
        cold_call = (record_cold_chain(self.profile, chain_timed[0]["rounds"], chain_timed[1]["rounds"],
                                       at=self.result.at) if chain_timed else None)
        self.model = refit(self.profile, cv_folds=self.cv_folds, freshness=model.freshness)
        if cold_call is not None:  # replay: the chain as timed in these rounds (the profile keeps a median)
            self.model = dataclasses.replace(self.model, ceilings={**self.model.ceilings,
                                                                   "cold_call_overhead_s": cold_call["now"]})
        out = add_errors(pd.concat([repredict(self.model), measured], axis=1))
        out.attrs["paired"] = {**self.result.to_dict(), "measure_wall_s": wall_s}
        console.print(self.result.describe(self.suite))
        if cold_call is not None:
            out.attrs["paired"]["cold_call_overhead_s"] = cold_call
            before = "none" if cold_call["profiled"] is None else f"{1e6 * cold_call['profiled']:.1f} us"
            console.print(f"cold start per kernel kind, timed in the same rounds: {1e6 * cold_call['now']:.1f} us "
                          f"(profiled: {before}; replay uses this run's value); the profile now keeps "
                          f"{1e6 * cold_call['stored']:.1f} us, the median of its recent measurements (held-out "
                          "scoring keeps the value from before the run)")
        return out


def cold_chain_jobs(model: CostModel, device: torch.device, timing: TimingConfig
                    ) -> list[tuple[Callable[[], Any], bool]]:
    """The ceilings' cold-call chain twice, as (job, evict caches before each call): cold,
    then warm, for a paired run to re-time beside its layers; [] where no cold-call
    overhead applies (CUDA, or layers timed warm)."""
    from costmodel.measure.ceilings import cold_chain  # noqa: PLC0415

    if device.type != "cpu" or not timing.cold_cache or model.fingerprint.cache != "cold":
        return []
    chain = cold_chain(device, model.fingerprint.dtype)
    return [(chain, True), (chain, False)]


def heldout_for(rt: Any, model: CostModel, traces: Sequence[Sequence[KernelSpec]], *, what: str,
                runners: bool = True) -> Any:
    """The run's held-out models (``sim.predict.heldout.fit_heldout``: refitted once, before the
    measuring rounds, on the profile without any kernel of ``traces``), announced; ``runners=False``
    leaves the drift references without runners here (rank processes build and time their own)."""
    from sim.predict.heldout import fit_heldout  # noqa: PLC0415

    from sim.predict.heldout_drift import build_references  # noqa: PLC0415

    heldout = fit_heldout(rt.open_profile(), model, traces, what=what)
    console.print(heldout.describe())
    heldout.references = build_references(heldout, traces, rt.device, cold=rt.timing.cold_cache,
                                          make_run=None if runners else (lambda spec: None))
    return heldout


def pairing_for(cfg: Any, rt: Any, suite: str) -> Pairing | None:
    """The ``Pairing`` of a measuring experiment when ``calibration.paired`` (the default)."""
    return Pairing(rt.open_profile(), suite) if paired_enabled(cfg) else None


def evaluate_workloads(
    model: CostModel, workloads: Sequence[Workload], *, device: torch.device, timing: TimingConfig,
    description: str, progress: bool = True, peak_flops_per_s: float | None = None,
    references: Sequence[DriftReference] = (), pairing: Pairing | None = None, heldout: Any = None,
) -> pd.DataFrame:
    """Predicted (every level) and measured latency of every workload, with errors.

    ``references`` (profiled kernels, ``drift_references``) are timed in the same rounds as
    the workloads, as the profile timed them (no layer-style cache eviction); how fast they
    ran against the profile is ``df.attrs["profile_drift"]`` ({} without references).

    With ``pairing`` every distinct kernel of the workloads' traces is timed in those rounds
    instead (``sim.predict.paired``): the profile's rows of them are replaced, the models refitted
    and the workloads predicted from the refitted models; the predictions of the model as
    loaded and how far the machine had drifted from the profile are in
    ``df.attrs["paired"]``. On a CPU with cold layers the ceilings' cold-call chain is timed
    in those rounds too, cold and warm (``cold_chain_jobs``), and the overhead it gives
    replaces the profile's before the refit (``attrs["paired"]["cold_call_overhead_s"]``).

    With ``heldout`` (``sim.predict.heldout.HeldOut``, fitted before the run without any kernel of
    these traces) the returned table's predictions and errors are held out: the headline.
    The profile as loaded (lookup) and the paired refit (replay) are kept beside it, as
    ``pred_lookup_L3_s`` / ``pred_replay_L3_s`` columns and their error summaries in
    ``attrs["profile_lookup"]`` / ``attrs["replay"]`` (``scored_tables``).
    """
    from sim.predict.paired import kernel_jobs, layer_kernel_jobs, paired_order  # noqa: PLC0415 (sim.predict.paired imports the bench)

    predicted = predict_workloads(model, workloads)
    refs = [] if pairing is not None else list(references)
    # the held-out drift references (never a kernel of the traces), after the profile's
    hrefs = list(heldout.references) if heldout is not None else []
    traces = [w.trace for w in workloads]
    jobs = kernel_jobs(traces, device, cold=timing.cold_cache) if pairing is not None else []
    chain = cold_chain_jobs(model, device, timing) if pairing is not None else []
    n = len(workloads)
    first_ref = n + len(refs)
    first_chain = first_ref + len(hrefs)
    first_kernel = first_chain + len(chain)
    # an extra round re-times a noisy layer with what its checks are made of: its own kernels
    # (paired) or the drift references, and the held-out references
    held_refs = list(range(first_ref, first_chain))
    companions = ({i: ks + held_refs for i, ks in layer_kernel_jobs(traces, first_kernel).items()} if jobs else
                  {i: list(range(n, first_chain)) for i in range(n)})
    start = time.perf_counter()
    timed = measure_interleaved([w.run for w in workloads] + [r.run for r in refs] + [r.run for r in hrefs]
                                + [job for job, _ in chain] + jobs,
                                device=device, timing=timing, description=description, progress=progress,
                                evict=[timing.cold_cache] * n + [False] * (len(refs) + len(hrefs))
                                + [evict for _, evict in chain] + [False] * len(jobs),
                                order=paired_order(traces, first_kernel) if jobs else None,
                                watch=range(n), companions=companions)
    wall_s = time.perf_counter() - start
    measured = pd.DataFrame(timed[:n]).drop(columns="rounds")
    lookup = add_errors(pd.concat([predicted, measured], axis=1))
    replay = None
    if pairing is not None:
        replay = pairing.finish(model, jobs, timed[first_kernel:], lambda m: predict_workloads(m, workloads), measured,
                                wall_s, chain_timed=timed[first_chain:first_kernel])
    held, drift_scaled = heldout_scored(heldout, lambda m, f: predict_workloads(m, workloads, f), measured,
                                        timed[first_ref:first_chain])
    df = scored_tables(lookup, replay, held, heldout, heldout_drift=drift_scaled)
    if heldout is not None and jobs:
        df.attrs["heldout_by_kind"] = error_parts_of(traces, heldout.model, jobs, timed[first_kernel:], measured, model)
    df.attrs["rounds"] = timing.rounds
    df.attrs["freshness"] = dict(getattr(model, "freshness", {}) or {})
    df.attrs["profile_drift"] = drift_summary([t["measured_s"] for t in timed[n:n + len(refs)]], refs)
    df["achieved_gflops"] = df["flops"] / df["measured_s"] / 1e9
    df["intensity_flops_per_byte"] = df["flops"] / df["bytes_moved"]
    if peak_flops_per_s:
        df["mfu"] = df["flops"] / df["measured_s"] / peak_flops_per_s
    return df


def heldout_scored(heldout: Any, predict: Callable[[CostModel, Callable[[str], float] | None], pd.DataFrame],
                   measured: pd.DataFrame, reference_timings: Sequence[dict[str, Any]]
                   ) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The held-out headline table and its drift-scaled side score (``sim.predict.heldout_drift``),
    from ``predict(model, l3_factor)`` and the held-out references' timings ((None, None)
    without a held-out fit); sets ``heldout.drift``."""
    if heldout is None:
        return None, None
    from sim.predict.heldout_drift import family_drift  # noqa: PLC0415

    held = add_errors(pd.concat([predict(heldout.model, None), measured], axis=1))
    heldout.drift = family_drift(heldout.references, [t["measured_s"] for t in reference_timings])
    console.print(heldout.drift.describe())
    return held, add_errors(pd.concat([predict(heldout.model, heldout.drift.factor), measured], axis=1))


def error_parts_of(traces: Sequence[Sequence[KernelSpec]], heldout_model: CostModel, jobs: Sequence[Any],
                   kernel_timings: Sequence[dict[str, Any]], measured: pd.DataFrame,
                   as_loaded: CostModel) -> dict[str, Any]:
    """The held-out error's kernel parts by kernel kind (``sim.predict.error_parts``), printed in one
    line: held-out kernel seconds against the same kernels timed beside the layers in this run,
    split into the regression (held out / profiled) and drift (timed now / profiled) over the
    kernels ``as_loaded`` (the profile before the run) holds."""
    from sim.predict import error_parts  # noqa: PLC0415

    parts = error_parts.heldout_error_parts(traces, heldout_model, error_parts.timed_kernels(jobs, kernel_timings),
                                            float(measured["measured_s"].sum()), dict(as_loaded.measured_s))
    console.print(error_parts.describe(parts))
    return parts


def ape_summary(df: pd.DataFrame) -> dict[str, Any]:
    """Median, p90 and max APE per level of an evaluated table, and (rows with a backend)
    L3 predicted / measured per backend."""
    out: dict[str, Any] = {stat: {lv: float(fn(df[f"ape_{lv}_pct"])) for lv in LEVELS}
                           for stat, fn in (("median_ape_pct", np.median),
                                            ("p90_ape_pct", lambda a: np.percentile(a, 90)),
                                            ("max_ape_pct", np.max))}
    if "backend" in df:
        out["l3_over_measured"] = l3_over_measured(df)
    return out


#: the scorings kept beside the headline: (name in summary.json details, column prefix)
SIDE_SCORES = (("profile_lookup", "lookup"), ("replay", "replay"), ("heldout_drift_scaled", "heldout_drift"))


def scored_tables(lookup: pd.DataFrame, replay: pd.DataFrame | None, heldout_table: pd.DataFrame | None,
                  heldout: Any = None, *, heldout_drift: pd.DataFrame | None = None) -> pd.DataFrame:
    """The headline table with the other scorings beside it.

    The headline is held out where a held-out fit was made, else the replay (paired runs),
    else the lookup, and ``attrs["scoring"]`` says which. Each of lookup and replay adds
    ``pred_<prefix>_L3_s`` and ``ape_<prefix>_L3_pct`` columns and its error summary
    (``ape_summary``) under ``attrs[<name>]``; ``attrs["heldout"]`` describes the held-out
    fit (``{"scored": false}`` without one); ``heldout_drift`` (the held-out predictions
    scaled by the drift of ``sim.predict.heldout_drift``'s reference kernels) adds
    ``pred_heldout_drift_L3_s`` / ``ape_heldout_drift_L3_pct`` and
    ``attrs["heldout_drift_scaled"]``."""
    headline = heldout_table if heldout_table is not None else replay if replay is not None else lookup
    df = headline.copy()
    df.attrs = {}
    df.attrs["scoring"] = "held-out" if heldout_table is not None else "replay" if replay is not None else "lookup"
    for (name, prefix), table in zip(SIDE_SCORES, (lookup, replay, heldout_drift)):
        if table is None:
            continue
        df[f"pred_{prefix}_L3_s"] = table["pred_L3_s"].to_numpy()
        df[f"ape_{prefix}_L3_pct"] = table["ape_L3_pct"].to_numpy()
        df.attrs[name] = ape_summary(table)
    if replay is not None:
        df.attrs["paired"] = dict(replay.attrs.get("paired", {}))
    df.attrs["heldout"] = heldout.to_dict() if heldout is not None else {"scored": False}
    return df


def per_kernel_table(model: CostModel, workloads: Sequence[Workload], *, device: torch.device,
                     iterations: int, timing: TimingConfig | None = None) -> pd.DataFrame:
    """Every kernel of every workload, profiled inside the real run, next to its predictions
    (from cold caches, like the layer timer, when ``timing.cold_cache``)."""
    tables = []
    cold = timing if timing is not None and timing.cold_cache else None
    for w in workloads:
        measured = profile_kernels(w.run, w.trace, device=device, iterations=iterations, cold=cold)
        errors = per_kernel_errors(predict_trace(model, w.trace, quiet=True), measured)
        errors.insert(0, "workload", w.name)
        tables.append(errors)
    return pd.concat(tables, ignore_index=True)


def print_kernel_breakdown(per_kernel: pd.DataFrame, title: str) -> None:
    """Per workload and family: profiled time, L3 and L0 predictions, share of the time."""
    fam = pd.concat([summarise_kernels(t).assign(workload=w) for w, t in per_kernel.groupby("workload", sort=False)])
    print_table(fam, {"workload": "", "family": "", "kernels": "", "measured_s": "ms", "L3": "ms", "ape_L3_pct": ".1f",
                      "L0": "ms", "share_of_time": ".0%"}, title=title)


def predict_only(name: str, model: CostModel, workloads: Sequence[Workload], details: dict[str, Any], out: Any, *,
                 plot: Callable[[pd.DataFrame], None], columns: dict[str, str], title: str,
                 extra: Callable[[pd.DataFrame], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``measure=false`` tail every sweep experiment shares: predict every workload,
    write results.csv and the common summary (null errors; ``details.predictions``, plus
    what ``extra(df)`` adds), draw ``plot(df)``, print the table."""
    from experiments.common import predict_only_summary, write_outputs  # noqa: PLC0415

    df = predict_workloads(model, workloads)
    details = {**details, **(extra(df) if extra else {}),
               "predictions": df[["value", "backend", *(f"pred_{lv}_s" for lv in LEVELS)]].to_dict("records")}
    summ = predict_only_summary(name, model.fingerprint.describe(), df, details=details)
    write_outputs(out, df, summ)
    plot(df)
    print_table(df, columns, title=title)
    console.print(f"outputs in {out}")
    return summ


def measure_sweep(cfg: Any, rt: Any, model: CostModel, workloads: Sequence[Workload], *, what: str, suite: str,
                  references: Callable[[], Sequence[DriftReference]], description: str) -> tuple[pd.DataFrame, CostModel]:
    """The measuring part every sweep experiment (moe_skew, gnn_degree) shares: the held-out
    models (``heldout_for``), the paired kernels of ``suite`` (``pairing_for``), the drift
    ``references()``, every workload timed and scored (``evaluate_workloads``). Returns the table and the held-out
    model (the per-kernel breakdown is held out too, as the headline)."""
    heldout = heldout_for(rt, model, [w.trace for w in workloads], what=what)
    pairing = pairing_for(cfg, rt, suite)
    df = evaluate_workloads(model, workloads, device=rt.device, timing=rt.timing, pairing=pairing,
                            heldout=heldout, references=references(), description=description,
                            progress=bool(cfg.get("progress", True)), peak_flops_per_s=model.ceilings["peak_flops_per_s"])
    return df, heldout.model


def kernel_point_table(cfg: Any, rt: Any, model: CostModel, workloads: Sequence[Workload], points: int,
                       out: Any) -> tuple[int, pd.DataFrame]:
    """``per_kernel.point`` (an index into the sweep's ``points``, negative from the end): its
    workloads' kernels profiled one by one (``per_kernel_table``), written to per_kernel.csv.
    Returns (the point's index, the table)."""
    kp = int(cfg["per_kernel"]["point"]) % points
    table = per_kernel_table(model, [w for w in workloads if w.columns["point"] == kp], device=rt.device,
                             iterations=int(cfg["per_kernel"]["iterations"]), timing=rt.timing)
    table.to_csv(out / "per_kernel.csv", index=False)
    return kp, table


def print_sweep_report(df: pd.DataFrame, per_kernel: pd.DataFrame, summ: dict[str, Any], out: Any, *,
                       columns: dict[str, str], title: str, breakdown_title: str) -> dict[str, Any]:
    """The console tail of a measured sweep: the table, the per-kernel breakdown, the summary,
    where the outputs are. Returns ``summ``."""
    from experiments.common import print_summary  # noqa: PLC0415

    print_table(df, columns, title=title)
    print_kernel_breakdown(per_kernel, breakdown_title)
    print_summary(summ)
    console.print(f"outputs in {out}")
    return summ
