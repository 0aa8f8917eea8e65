"""The mods bench's dense-mask peer (attngen/bench/mods.py: _dense_mask): SDPA on the dense mask /
bias computes what the row's mask_mod / score_mod say (float64 reference of the expression tests),
on the CPU; a modification that does not add to the score has no dense form."""
import pytest
import torch

from attngen.bench import mods
from tests.kernels.test_expr import reference


@pytest.mark.parametrize("kind", ["alibi", "chunked", "prefix", "t5", "doc_window", "docs"])
def test_dense_mask_says_the_row(kind):
    B, H, S, D = 2, 2, 2048, 16
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask_mod, score_mod, sinks = mods._mods(kind, B, H, S, torch.device("cpu"))
    assert sinks is None
    dense = mods._dense_mask(mask_mod, score_mod, B, H, S, torch.device("cpu"))
    assert dense.dtype == (torch.bool if score_mod is None else torch.bfloat16)
    if score_mod is not None:  # the bias is rounded to bf16 as the bench gives it; compare on that
        dense = dense.double()
        scale = D ** -0.5
        s = (q @ k.transpose(-1, -2)) * scale + dense
        out = torch.softmax(s, -1) @ v
        ref = reference(q, k, v, mask_mod, lambda sc, b, h, qi, ki: sc + (score_mod(sc * 0, b, h, qi, ki).to(torch.bfloat16).double()))
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        ref = reference(q, k, v, mask_mod, None)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=1e-9)


def test_no_dense_form_of_a_modification_that_does_not_add():
    softcap = lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0)  # noqa: E731
    assert mods._dense_mask(None, softcap, 1, 2, 128, torch.device("cpu")) is None


def test_the_cli_mode_refuses_bad_arguments(capsys):
    import argparse

    from attngen import bench

    def run(*argv):
        p = argparse.ArgumentParser()
        bench.add_arguments(p)
        return bench.main(p.parse_args(["--mode", "mods", *argv]))

    assert run("--cases", "nope", "--out", "x.json") == 2
    assert "unknown nope" in capsys.readouterr().err
    assert run("--providers", "flex", "--out", "x.json") == 2
    assert run("--dtype", "fp16", "--out", "x.json") == 2
    assert run("--cases", "t5_bias_2k") == 2  # no --out
    if not torch.cuda.is_available():
        assert run("--cases", "t5_bias_2k", "--out", "x.json") == 1
        assert "needs a CUDA GPU" in capsys.readouterr().err
