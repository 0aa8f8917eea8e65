"""The pointer kernels at padded head dims in Triton's interpreter: head dims held as two column
tiles with masked columns (40 = 32 + 16 with 8 in use, 72 = 64 + 16 with 8, 88 = 64 + 32 with 24)
and one padded tile (59 in 64), with each knob the pointer kernels take (tiles, warps, stages,
lazy rescaling; the backward's tiles and fp32-atomic dQ), on Sq != Sk, sliding windows and
softcapping, forward (with LSE) and backward against float64 (flash-attn's 2x / 3x rule), through
attngen.attention under dispatch.forced_config -- the GPU grid's own case runner
(tests/gpu/test_gpu_grid.py), on both targets' modules (sm90's pointer kernel is the one the
host-bound downgrade runs on Hopper)."""

from __future__ import annotations

import pytest

from attngen.runtime import dispatch
from attngen.configs import BwdConfig, FwdConfig
from tests.gpu import test_gpu_grid as grid

FWD = [FwdConfig(32, 32, 4, 1), FwdConfig(16, 32, 2, 2, lazy_rescale=True), FwdConfig(32, 16, 4, 1)]
BWD = [BwdConfig(16, 32, 2, 1, 32, 16, 2, 1), BwdConfig(32, 16, 4, 1, 16, 32, 2, 1, atomic_dq=True),
       BwdConfig(16, 16, 2, 2, 16, 16, 2, 2)]


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """Kernels rendered on demand go to a temporary cache, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNGEN_CACHE_DIR", str(tmp_path_factory.mktemp("kernels")))
        yield


SHAPES = [(37, 53, "window", (9, 3), "gqa", "bshd"), (29, 17, "softcap", (-1, -1), "mqa", "bhsd"),
          (23, 41, "causal-softcap", (-1, -1), "mha", "packed")]


@pytest.mark.parametrize("i", range(3))
@pytest.mark.parametrize("hd", [40, 72, 88, 59])
def test_pointer_kernels_at_padded_head_dims(hd, i, kernel_cache):
    sq, sk, mask, window, heads, layout = SHAPES[i]
    case = grid.Case(hd, ("bf16", "fp16")[i % 2], sq, sk, mask, window, heads, layout, "default", 100 * hd + i)
    records = []
    with dispatch.forced_target(("sm90", "sm80")[i % 2]), dispatch.forced_config(fwd=FWD[i], bwd=BWD[i]):
        grid.run_case(case, records, device="cpu")
    (rec,) = records
    assert rec["passed"] and rec["kernels"][0] == "_attn_fwd" and "_attn_bwd_dkdv" in rec["kernels"], rec
