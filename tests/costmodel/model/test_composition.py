"""What a layer pays per op beyond its kernels: the per-call cost among other kinds at every
kernel, the cold start of each kind, and views (warm per op, cold at each view kind's first)."""

from types import SimpleNamespace

import numpy as np
import pytest

from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gemm import GemmSpec
from costmodel.model.cold_start import cold_start_charges_s
from costmodel.model.composition import composition_charges_s, composition_s, per_call_s, view_charges_s

HOST = {"interleave_overhead_s": 3e-6, "view_op_s": 1e-6, "view_cold_overhead_s": 1e-5}


def stub(cache: str = "cold", **ceilings) -> SimpleNamespace:
    return SimpleNamespace(fingerprint=SimpleNamespace(cache=cache), ceilings={"cold_call_overhead_s": 2e-5, **ceilings})


def test_every_kernel_pays_the_per_call_cost_beside_its_kinds_cold_start():
    trace = [GemmSpec(4, 8, 8), ElementwiseSpec("mul", 8), GemmSpec(16, 8, 8)]
    model = stub(**HOST)
    got = composition_charges_s(model, "L3", trace)
    assert got.tolist() == pytest.approx([3e-6 + 2e-5, 3e-6 + 2e-5, 3e-6])  # the second GEMM's kind is warm
    assert got.tolist() == pytest.approx((cold_start_charges_s(model, "L3", trace) + 3e-6).tolist())
    assert composition_s(model, "L2", trace) == pytest.approx(3 * 3e-6 + 2 * 2e-5)
    assert composition_s(model, "L3", []) == 0.0


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_flops_only_levels_and_profiles_without_host_costs_pay_no_per_call_cost(level):
    trace = [GemmSpec(4, 8, 8)]
    assert per_call_s(stub(**HOST), level) == 0.0 and not composition_charges_s(stub(**HOST), level, trace).any()
    assert per_call_s(stub(), "L3") == 0.0  # a profile made before the ceiling existed
    assert per_call_s(stub("warm", **HOST), "L3") == 3e-6  # running among other kinds is not a cache state


def test_views_pay_their_warm_cost_and_each_view_kinds_first_call_its_cold_cost():
    views = ["aten.t.default", "aten.view.default", "aten.t.default", "aten.t.default", "aten.select.int"]
    got = view_charges_s(stub(**HOST), "L3", views)
    assert got.tolist() == pytest.approx([1.1e-5, 1.1e-5, 1e-6, 1e-6, 1.1e-5])
    assert view_charges_s(stub("warm", **HOST), "L2", views).tolist() == pytest.approx([1e-6] * 5)
    assert not view_charges_s(stub(**HOST), "L1", views).any()
    assert not view_charges_s(stub(), "L3", views).any() and view_charges_s(stub(**HOST), "L3", []).shape == (0,)


def test_a_batch_of_traces_pays_what_each_trace_pays_alone():
    from sim.predict.simulator import predict_trace, predict_traces

    class Flat:  # every kernel 1 us at every level: what remains is the charges
        fingerprint = SimpleNamespace(cache="cold")
        ceilings = {"cold_call_overhead_s": 2e-5, "recold_fraction_by_mib": {"1": 0.5}, **HOST}

        def predict(self, trace, levels):
            import pandas as pd
            return pd.DataFrame({lv: np.full(len(trace), 1e-6) for lv in levels})

        def predict_table(self, table, levels, keys=None):
            import pandas as pd
            return pd.DataFrame({lv: np.full(len(table), 1e-6) for lv in levels})

    rng = np.random.default_rng(1)
    pool = [ElementwiseSpec("mul", 8), GemmSpec(4, 64, 64), GemmSpec(16, 256, 512)]
    traces = [[pool[i] for i in rng.integers(0, len(pool), size=n)] for n in (1, 6, 11)]
    batch = predict_traces(Flat(), traces, ["L3"])["pred_L3_s"].to_numpy()
    alone = [predict_trace(Flat(), t, ["L3"])["L3"].sum() for t in traces]
    assert batch == pytest.approx(alone)
    assert alone[0] == pytest.approx(1e-6 + 3e-6 + 2e-5)
