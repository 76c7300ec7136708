"""Memory estimates of the layers (hand-computed) and the refusal of what cannot fit."""

from __future__ import annotations

import pytest
import torch

import sim.workloads.memory as memory
from sim.workloads.gnn_layer import GNNConfig
from sim.workloads.memory import MemoryNeed, check_fits_device, combine, gnn_need, mlp_need, moe_need
from sim.workloads.mlp_layer import MLPConfig
from sim.workloads.moe_layer import MoEConfig


def test_moe_weights_are_the_router_and_every_expert_projection():
    cfg = MoEConfig(tokens=4, d_model=2, d_ff=3, num_experts=2, top_k=1, expert="mlp", backend="loop")
    # router D*E = 4, experts E * (D*F + F*D) = 2 * 12 = 24 elements of 4 bytes
    assert moe_need(cfg).weights_bytes == 4 * (4 + 24)


def test_padded_moe_activations_grow_with_the_busiest_expert():
    cfg = MoEConfig(tokens=64, d_model=8, d_ff=16, num_experts=4, top_k=2, backend="padded")
    spread, worst = moe_need(cfg, max_rows_per_expert=32), moe_need(cfg)
    assert worst.activations_bytes > spread.activations_bytes
    # SwiGLU's 4 hidden maps differ by E x (64 - 32) rows x F each, the padded buffers by 2 x E x 32 x D
    assert worst.activations_bytes - spread.activations_bytes == 4 * (4 * 4 * 32 * 16 + 2 * 4 * 32 * 8)


def test_mlp_and_gnn_needs():
    assert mlp_need(MLPConfig(batch=2, d_model=3, d_hidden=5)) == MemoryNeed(4 * 2 * 15, 4 * 2 * (6 + 10))
    small, big = (gnn_need(GNNConfig(num_nodes=100), num_edges=e) for e in (1000, 2000))
    assert big.weights_bytes > small.weights_bytes and big.activations_bytes > small.activations_bytes


def test_combine_adds_weights_and_takes_the_largest_activations():
    assert combine([MemoryNeed(1, 10), MemoryNeed(2, 30)]) == MemoryNeed(3, 30)


def test_a_need_beyond_the_device_is_refused_with_sizes_and_keys(monkeypatch):
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 100e9)
    check_fits_device(MemoryNeed(80e9, 9e9), torch.device("cpu"), what="x", knobs=["moe.d_model"])  # 89 <= 90
    with pytest.raises(ValueError, match=r"the layers need at least 131.0 GB \(weights 130.0 GB \+ activations of the "
                                         r"largest point 1.0 GB\), more than 90% of this cpu device's 100.0 GB; "
                                         r"reduce moe.d_model, moe.d_ff"):
        check_fits_device(MemoryNeed(130e9, 1e9), torch.device("cpu"), what="the layers", knobs=["moe.d_model", "moe.d_ff"])
