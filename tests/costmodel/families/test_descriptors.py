"""FLOPs and bytes formulas against hand-computed cases, validation, table round trips."""

from __future__ import annotations

import math

import pytest

from costmodel.families.descriptor import families, from_record
from costmodel.families.elementwise import ElementwiseSpec
from costmodel.families.gather import GatherSpec
from costmodel.families.gemm import GemmSpec
from costmodel.families.grouped_gemm import GroupedGemmSpec
from costmodel.families.histogram import HistogramSpec
from costmodel.families.scatter import ScatterSpec
from costmodel.families.softmax import SoftmaxSpec
from costmodel.families.sort import SortSpec
from costmodel.families.spmm import SpmmSpec
from costmodel.families.topk import TopkSpec


def test_gemm_flops_bytes_intensity():
    g = GemmSpec(2, 3, 4)
    assert g.flops() == 2 * 2 * 3 * 4 == 48
    assert g.bytes_moved() == 4 * (2 * 3 + 3 * 4 + 2 * 4) == 104
    assert g.intensity() == pytest.approx(48 / 104)
    # square n: AI = 2n / (3 s) (seed article 19.2.5): n = 4096 in bf16 -> 1365 FLOP/B
    assert GemmSpec(4096, 4096, 4096, "bfloat16").intensity() == pytest.approx(2 * 4096 / 6)


def test_grouped_gemm_useful_vs_executed():
    grouped = GroupedGemmSpec((3, 0, 5), 4, 2, "grouped_mm")
    padded = GroupedGemmSpec((3, 0, 5), 4, 2, "padded_bmm")
    assert grouped.flops() == padded.flops() == 2 * 4 * 2 * 8
    assert grouped.executed_flops() == 2 * 4 * 2 * 8
    assert padded.executed_flops() == 2 * 4 * 2 * 15  # 3 experts x max 5 rows
    # grouped_mm reads the weights of the 2 experts with tokens; padded bmm all 3
    assert grouped.weight_experts() == 2 and padded.weight_experts() == 3
    assert grouped.bytes_moved() == 4 * (8 * 4 + 2 * 4 * 2 + 8 * 2)
    assert padded.bytes_moved() == 4 * (15 * 4 + 3 * 4 * 2 + 15 * 2)


def test_gather_scatter_spmm_bytes():
    assert GatherSpec(10, 4, 7).bytes_moved() == 2 * 10 * 4 * 4 + 10 * 8
    assert GatherSpec(10, 4, 7).flops() == 0
    s = ScatterSpec(10, 4, 3, "sum", "index_add")
    assert s.flops() == 40
    assert s.bytes_moved() == (10 + 3) * 4 * 4 + 10 * 8
    assert ScatterSpec(3, 4, 10, "copy", "index_copy").flops() == 0
    sp = SpmmSpec(nnz=10, width=4, num_dst=3, num_src=5)
    assert sp.flops() == 2 * 10 * 4
    # unset columns are uniform draws: 2 reads per source row on average, so a row is read
    # with probability 1 - e^-2 and 5 * (1 - e^-2) rows of X are read
    assert sp.bytes_moved() == pytest.approx(10 * (4 + 8) + 4 * 8 + (5 * (1 - math.exp(-2)) + 3) * 4 * 4)
    assert sp.columns() == pytest.approx((1 / math.sqrt(2), 1 - math.exp(-2)))
    skewed = SpmmSpec(10, 4, 3, 5, 0.0, "float32", src_cv=1.5, src_read_share=0.6)  # 3 of 5 rows read
    assert skewed.bytes_moved() == 10 * (4 + 8) + 4 * 8 + (3 + 3) * 4 * 4
    assert skewed.key() != sp.key() and "src_cv" not in sp.key()  # unset fields keep old keys


def test_small_op_formulas():
    assert ElementwiseSpec("add", 100, "bfloat16").bytes_moved() == 600  # the article's 6N bytes
    assert ElementwiseSpec("add", 100).flops() == 100
    assert ElementwiseSpec("silu", 10).flops() == 40
    assert ElementwiseSpec("fill", 10).bytes_moved() == 40
    assert SoftmaxSpec(2, 8).flops() == 5 * 16
    assert TopkSpec(2, 8, 3).flops() == pytest.approx(2 * 8 * math.log2(4))
    assert TopkSpec(2, 8, 3).bytes_moved() == 2 * 8 * 4 + 2 * 3 * 12
    assert SortSpec(10).bytes_moved() == 10 * 24
    assert HistogramSpec(10, 4).bytes_moved() == 14 * 8


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GemmSpec(-1, 3, 4), "GemmSpec.m must be a positive integer"),
        (lambda: GemmSpec(1, 0, 4), "GemmSpec.k must be a positive integer"),
        (lambda: GemmSpec(1, 2, 3, "float8"), "GemmSpec.dtype must be one of"),
        (lambda: TopkSpec(4, 8, 9), r"TopkSpec.k must be in \[1, cols=8\]"),
        (lambda: GroupedGemmSpec((0, 0), 4, 4), "must route at least one token"),
        (lambda: GroupedGemmSpec((1, -1), 4, 4), "integers >= 0"),
        (lambda: GroupedGemmSpec((1,), 4, 4, "loop"), "GroupedGemmSpec.impl must be one of"),
        (lambda: ScatterSpec(4, 4, 4, "max", "index_add"), "ScatterSpec.reduce must be one of \\['sum'\\]"),
        (lambda: ScatterSpec(4, 4, 4, "sum", "cuda_magic"), "ScatterSpec.backend must be one of"),
        (lambda: ScatterSpec(8, 4, 4, "copy", "index_copy"), "num_rows <= num_dst"),
        (lambda: GatherSpec(4, 4, 4, index_cv=-1.0), "index_cv must be a finite number >= 0"),
        (lambda: ElementwiseSpec("tanhshrink", 4), "ElementwiseSpec.op must be one of"),
    ],
)
def test_bad_fields_name_the_field_and_range(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_records_round_trip_and_keys_are_stable():
    specs = [
        GemmSpec(2, 3, 4), GroupedGemmSpec((3, 0, 5), 8, 16, "padded_bmm"), GatherSpec(10, 4, 7, 1.5, True),
        ScatterSpec(10, 4, 3, "max", "scatter_reduce", 0.5, False), SpmmSpec(10, 4, 3, 5, 2.0),
        ElementwiseSpec("floordiv", 9, "int64"), SoftmaxSpec(2, 3), TopkSpec(2, 3, 1), SortSpec(5), HistogramSpec(5, 2),
    ]
    assert {s.family for s in specs} == set(families())
    for s in specs:
        rec = s.to_record()
        # tables store everything as text/number; rebuilding gives an equal, equally hashed descriptor
        text_rec = {k: (str(v) if isinstance(v, bool) else v) for k, v in rec.items()}
        again = from_record(text_rec)
        assert again == s and hash(again) == hash(s) and again.key() == s.key()
    assert len({s.key() for s in specs}) == len(specs)


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown kernel family 'conv'"):
        from_record({"family": "conv"})


def test_grouped_gemm_suite_adds_tagged_model_shapes():
    """The full suite's public-config expert shapes: every [name, experts, k, n] x tokens x skew
    x impl, tagged model:<name>, with the routing split exactly as the grid splits it."""
    from types import SimpleNamespace

    from costmodel.families.grouped_gemm import power_law_counts, suite

    base = {"experts": [4], "total_tokens": [8], "kn": [[256, 512]], "skew_exponent": [0.0], "impl": ["grouped_mm"]}
    ctx = SimpleNamespace(dtype="float32")
    assert [t for t, _ in suite(base, ctx)] == ["grid"]
    with_models = {**base, "model_shapes": {"shapes": [["mixtral_div4", 8, 1024, 3584], ["mixtral_div4", 8, 3584, 1024]],
                                            "total_tokens": [16, 64], "skew_exponent": [0.0, 4.0]}}
    out = suite(with_models, ctx)
    models = [(t, s) for t, s in out if t != "grid"]
    assert len(models) == 2 * 2 * 2 and {t for t, _ in models} == {"model:mixtral_div4"}
    first = models[0][1]
    assert (first.k, first.n, first.impl) == (1024, 3584, "grouped_mm")
    assert first.tokens_per_expert == power_law_counts(16, 8, 0.0) == (2,) * 8
    assert sum(models[-1][1].tokens_per_expert) == 64 and models[-1][1].tokens_per_expert[0] > 32
