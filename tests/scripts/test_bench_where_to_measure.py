"""scripts/bench_where_to_measure.py: the test / pool / base split, the spread-over-bytes
picks (hand-computed), and bad budgets refused before any fit."""

from __future__ import annotations

import pandas as pd
import pytest
from script_loader import loaded_script


@pytest.fixture(scope="module")
def script():
    yield from loaded_script("bench_where_to_measure")


def table() -> pd.DataFrame:
    return pd.DataFrame({
        "key": ["a", "b", "c", "d", "e", "f"],
        "family": ["gemm", "gemm", "gemm", "scatter", "gemm", "sort"],
        "suite": ["moe", "moe", "moe", "moe", "full", "full"],
        "tag": ["paired", "heldout_neighbour", "heldout_neighbour", "heldout_neighbour", "grid", "grid"],
        "bytes_moved": [1.0, 30.0, 10.0, 5.0, 2.0, 3.0],
    })


def test_the_split_leaves_the_suite_and_its_neighbours_out_of_the_base_in_the_tests_families(script):
    base, pool, test = script.split(table(), "moe")
    assert test["key"].tolist() == ["a"]
    assert pool["key"].tolist() == ["b", "c"]  # the scatter neighbour has no test kernel to help
    assert base["key"].tolist() == ["e"]  # the other suite's GEMM; its sort is not a test family


def test_bytes_picks_are_evenly_spaced_ranks_of_bytes_per_family(script):
    pool = pd.DataFrame({"family": ["gemm"] * 5 + ["scatter"], "bytes_moved": [50.0, 10.0, 40.0, 20.0, 30.0, 1.0]})
    assert script.pick_bytes(pool, 3) == [0, 1, 4, 5]  # gemm by bytes: 10 (1), 30 (4), 50 (0); scatter: its one
    assert sorted(script.pick_random(pool, 2, seed=0)) == script.pick_random(pool, 2, seed=0)
    assert len(script.pick_random(pool, 2, seed=0)) == 3


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0"], "--budgets: every budget must be >= 1"),
    (["--seeds", "0"], "--seeds must be >= 1"),
])
def test_bad_counts_are_refused_before_any_fit(script, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        script.main([str(tmp_path), *args])
    assert message in capsys.readouterr().err
