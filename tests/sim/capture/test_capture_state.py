"""Capture leaves the caller's training state as it found it: parameters, grads, buffers and
the inputs bit-identical after a prediction, forward alone and with backward=True."""

from __future__ import annotations

import hashlib

import pytest
import torch

from sim.api import capture_module, predict_module_latency
from tests.sim.capture.test_capture import _model


def _digest(t: torch.Tensor | None) -> tuple | None:
    if t is None:
        return None
    data = t.detach().cpu().contiguous()
    return str(data.dtype), tuple(data.shape), hashlib.sha256(data.view(-1).view(torch.uint8).numpy().tobytes()
                                                              if data.numel() else b"").hexdigest()


def _state(module: torch.nn.Module, inputs: tuple) -> dict:
    """Every parameter, grad (its value and which object it is), buffer and input, hashed."""
    out: dict = {}
    for name, p in module.named_parameters():
        out[f"param {name}"] = _digest(p)
        out[f"grad {name}"] = None if p.grad is None else (id(p.grad), _digest(p.grad))
    for name, b in module.named_buffers():
        out[f"buffer {name}"] = _digest(b)
    for i, x in enumerate(inputs):
        out[f"input {i}"] = _digest(x)
        if x.is_leaf:
            out[f"input {i} grad"] = None if x.grad is None else (id(x.grad), _digest(x.grad))
    return out


class InPlaceOnInput(torch.nn.Module):
    """Writes into its input (x.add_), then runs an in-place relu on its own activation."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        x[0].mul_(2.0)  # through a view of the input, too
        return self.lin(x).relu_()


def _linear_with_accumulated_grads() -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8, requires_grad=True)
    for _ in range(2):  # the user's own training steps: grads accumulated over two backward calls
        lin(x).pow(2).sum().backward()
    return lin, (x,)


def _in_place() -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(1)
    return InPlaceOnInput(), (torch.randn(16, 8),)


def _train_mode_batch_norm() -> tuple[torch.nn.Module, tuple]:
    torch.manual_seed(2)
    bn = torch.nn.BatchNorm1d(8).train()
    assert int(bn.num_batches_tracked) == 0
    return bn, (torch.randn(16, 8),)


CASES = {"linear_with_grads": _linear_with_accumulated_grads, "in_place_on_input": _in_place,
         "batch_norm_train": _train_mode_batch_norm}


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_prediction_leaves_params_grads_buffers_and_inputs_bit_identical(case, backward, tmp_path):
    model = _model(tmp_path)
    module, inputs = CASES[case]()
    before = _state(module, inputs)
    pred = predict_module_latency(module, inputs, model, backward=backward)
    assert pred.total_s["L3"] > 0
    assert _state(module, inputs) == before
    if backward:  # the capture's own backward ran (and started from no grads), then was put away
        assert "backward" in pred.phase_s


def test_grads_that_were_none_stay_none_and_the_backward_is_still_captured():
    lin = torch.nn.Linear(8, 4)
    trace = capture_module(lin, (torch.randn(5, 8),), backward=True)
    assert lin.weight.grad is None and lin.bias.grad is None
    assert any(op.phase == "backward" for op in trace.ops)


def test_the_same_trace_whatever_grads_the_module_held():
    lin, (x,) = _linear_with_accumulated_grads()
    with_grads = capture_module(lin, (x,), backward=True).table()
    lin.zero_grad(set_to_none=True)
    x.grad = None
    without = capture_module(lin, (x,), backward=True).table()
    assert with_grads[["aten_op", "kind", "kernel"]].equals(without[["aten_op", "kind", "kernel"]])


def test_an_input_inside_the_callers_graph_is_cut_from_it():
    """The capture's backward stops at the inputs: the caller's graph is neither run (no grads
    land in the caller's upstream layer) nor freed (the caller's own backward still works)."""
    upstream, lin = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    x = upstream(torch.randn(6, 8))  # an intermediate of the caller's graph
    trace = capture_module(lin, (x,), backward=True)
    assert upstream.weight.grad is None
    assert trace.table()["phase"].eq("backward").any()
    x.sum().backward()  # would raise had the capture's backward freed the caller's graph
    assert upstream.weight.grad is not None
