"""sim.distributed.torchrun_env: which device and backend a process started by torchrun takes,
and the message of each launch it cannot serve, before any process group."""

from __future__ import annotations

import pytest
import torch

from sim.distributed.torchrun_env import LaunchError, process_group_backend, rank_env

ENV = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "1"}


def test_a_cpu_host_runs_gloo_on_the_cpu():
    me = rank_env("auto", ENV, cuda_devices=0)
    assert (me.rank, me.world_size, me.local_rank, me.device) == (1, 2, 1, torch.device("cpu"))
    assert me.backend == "gloo"


def test_a_gpu_host_gives_each_local_rank_its_own_gpu_under_nccl():
    me = rank_env("auto", ENV, cuda_devices=4)
    assert me.device == torch.device("cuda", 1) and me.backend == "nccl"
    assert rank_env("cpu", ENV, cuda_devices=4).device == torch.device("cpu")  # asked for: gloo beside the GPUs
    assert process_group_backend(torch.device("cuda", 0)) == "nccl"


def test_local_rank_defaults_to_zero():
    env = {k: v for k, v in ENV.items() if k != "LOCAL_RANK"}
    assert rank_env("cuda", env, cuda_devices=1).device == torch.device("cuda", 0)


@pytest.mark.parametrize("device, env, gpus, message", [
    ("auto", {"RANK": "0"}, 0,
     "WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set: start this script with torchrun (or srun + torchrun), "
     "e.g. torchrun --nproc_per_node=2 scripts/x.py"),
    ("tpu", ENV, 0, "--device must be one of auto, cpu, cuda, got 'tpu'"),
    ("cuda", ENV, 0, "--device cuda: this host has no CUDA device"),
    ("auto", {**ENV, "LOCAL_RANK": "2"}, 2, "LOCAL_RANK=2 but this host has 2 GPU(s): start at most 2 processes per host"),
    ("auto", {**ENV, "RANK": "2"}, 0, "RANK=2 must lie in [0, WORLD_SIZE=2)"),
    ("auto", {**ENV, "WORLD_SIZE": "two"}, 0, "WORLD_SIZE='two' is not an integer"),
])
def test_a_launch_it_cannot_serve_says_what_to_change(device, env, gpus, message):
    with pytest.raises(LaunchError) as err:
        rank_env(device, env, cuda_devices=gpus, script="scripts/x.py")
    assert message in str(err.value)
