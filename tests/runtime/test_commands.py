"""`attngen explain` and `attngen warmup` on the CPU (interpreter)."""

from __future__ import annotations

import json

from attngen.cli import main


def test_explain_prints_kernel_config_bucket(capsys):
    assert main(["explain", "--shape", "2,32,8,1000,1000,128", "--causal", "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kernel"] == "attn_fwd_bf16_hd128_gqa4_causal_sm80"
    assert info["bucket"] == "q1024_k1024_bh64" and info["config_source"] == "default"


def test_explain_bad_shape_names_the_argument(capsys):
    assert main(["explain", "--shape", "2,30,8,100,100,64", "--device", "cpu"]) == 2
    assert "q: 30 query heads is not a multiple of the 8 KV heads" in capsys.readouterr().err


def test_warmup_compiles_each_bucket(capsys, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text("kernels:\n  - name: tiny\n    head_dim: 16\n    num_q_heads: 2\n    num_kv_heads: 1\n"
                    "    mask: causal\n    dtypes: fp16\n    targets: sm80\n")
    assert main(["warmup", str(spec), "--seqlens", "20,70", "--device", "cpu", "--backward"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[3] for ln in out] == ["q32_k32_bh2", "q128_k128_bh2"], out


def test_warmup_bad_spec_is_exit_2(capsys, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("kernels:\n  - name: bad\n    head_dim: 999\n")
    assert main(["warmup", str(spec), "--device", "cpu"]) == 2
    assert "head_dim" in capsys.readouterr().err


def test_warmup_document_entries_warm_the_varlen_kernels(capsys, tmp_path):
    spec = tmp_path / "docs.yaml"
    spec.write_text("kernels:\n  - name: docs\n    head_dim: 16\n    num_q_heads: 2\n    num_kv_heads: 1\n"
                    "    mask: document\n    document_mask: causal\n    dtypes: fp16\n    targets: sm80\n")
    assert main(["warmup", str(spec), "--seqlens", "20", "--device", "cpu", "--batch", "3"]) == 0
    out = capsys.readouterr().out.split()
    assert "attn_fwd_fp16_hd16_gqa2_doc_causal_sm80" in out and "q32_k32_bh8" in out, out
