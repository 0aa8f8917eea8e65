"""Context-parallel attention on 2 and 4 GPUs of one host (NCCL): the CPU suite's cases
(tests/distributed/cases.py) on the real kernels, each rank's output, LSE and gradients put back
together and checked as on the CPU (flash-attn rule against float64, and against single-GPU
attngen). Skipped with fewer GPUs than the group needs."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.test_cp import check_world


@pytest.mark.parametrize("world", [2, 4])
def test_gpu_context_parallel_matches_one_gpu(world, tmp_path):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, this host has {torch.cuda.device_count()}")
    check_world(world, tmp_path, device="cuda")
