"""The spec language: every bad field is reported with file, entry and field; good files expand to
the KernelSpecs (uris) we expect."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from attngen.env import REPO_ROOT
from attngen.spec import KernelSpec, SpecError, load_spec, load_specs, parse_spec, spec_files, spec_label

SPECS_DIR = REPO_ROOT / "specs"

# A valid entry. Bad rows put a changed copy of it at index 1 (named "bad"), after a good entry at
# index 0, so that the message has to name the right entry by name *and* index.
GOOD = {
    "name": "k0",
    "head_dim": 128,
    "num_q_heads": 32,
    "num_kv_heads": 8,
    "mask": "causal",
    "dtypes": ["bf16"],
    "targets": ["sm80"],
    "families": ["fwd"],
}
DROP = object()  # a change that removes the field


def write_spec(tmp_path: Path, doc, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def entry(**changes) -> dict:
    out = dict(GOOD)
    for key, value in changes.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value


def load_entry(tmp_path: Path, **changes):
    """Load a one-entry spec (GOOD + changes) and return its SpecFile."""
    return load_spec(write_spec(tmp_path, {"kernels": [entry(**changes)]}))


# (id, changes to the bad entry, field the message must name, words the message must hold)
ENTRY_ROWS = [
    ("unknown_entry_key", {"head_dims": 64}, "head_dims", "unknown field"),
    ("head_dim_string", {"head_dim": "128"}, "head_dim", "must be an integer"),
    ("head_dim_bool", {"head_dim": True}, "head_dim", "must be an integer"),
    ("head_dim_float", {"head_dim": 128.0}, "head_dim", "must be an integer"),
    ("mask_list", {"mask": ["causal"]}, "mask", "must be one of"),
    ("description_list", {"description": ["free", "text"]}, "description", "must be a string"),
    ("targets_nested_list", {"targets": [["sm80"]]}, "targets", "unknown value"),
    ("head_dim_512", {"head_dim": 512}, "head_dim", "in [8, 256], got 512"),
    ("head_dim_4", {"head_dim": 4}, "head_dim", "in [8, 256], got 4"),
    ("head_dim_qk_7", {"head_dim": DROP, "head_dim_qk": 7, "head_dim_v": 128}, "head_dim_qk",
     "in [8, 256], got 7"),
    ("head_dim_v_300", {"head_dim": DROP, "head_dim_qk": 128, "head_dim_v": 300}, "head_dim_v",
     "got 300"),
    ("head_dim_and_head_dim_qk", {"head_dim_qk": 128}, "head_dim_qk", "not both"),
    ("head_dim_missing", {"head_dim": DROP}, "head_dim", "is required"),
    ("head_dim_null", {"head_dim": None}, "head_dim", "is required"),
    ("window_0", {"mask": "sliding_window", "window": 0}, "window", ">= 1, got 0"),
    ("window_string", {"mask": "sliding_window", "window": "4k"}, "window", "must be an integer"),
    ("gqa_ratio_0", {"num_q_heads": DROP, "num_kv_heads": DROP, "gqa_ratio": 0}, "gqa_ratio",
     "got 0"),
    ("gqa_ratio_65", {"num_q_heads": DROP, "num_kv_heads": DROP, "gqa_ratio": 65}, "gqa_ratio",
     "got 65"),
    ("gqa_ratio_null", {"num_q_heads": DROP, "num_kv_heads": DROP, "gqa_ratio": None},
     "num_q_heads", "is required"),
    ("num_kv_heads_0", {"num_kv_heads": 0}, "num_kv_heads", ">= 1, got 0"),
    ("softcap_negative", {"softcap": -1}, "softcap", ">= 0"),
    ("softcap_string", {"softcap": "50"}, "softcap", "number"),
    ("softcap_bool", {"softcap": True}, "softcap", "number"),
    ("softcap_nan", {"softcap": math.nan}, "softcap", "finite"),
    ("softmax_scale_0", {"softmax_scale": 0}, "softmax_scale", "> 0"),
    ("softmax_scale_negative", {"softmax_scale": -0.125}, "softmax_scale", "> 0"),
    ("softmax_scale_inf", {"softmax_scale": math.inf}, "softmax_scale", "finite"),
    ("q_heads_not_multiple_of_kv", {"num_q_heads": 30}, "num_q_heads",
     "30 is not a multiple of num_kv_heads 8"),
    ("gqa_ratio_vs_head_counts", {"gqa_ratio": 2}, "gqa_ratio", "is 2 but num_q_heads/num_kv_heads = 32/8"),
    ("q_heads_not_multiple_of_gqa", {"num_kv_heads": DROP, "num_q_heads": 30, "gqa_ratio": 4},
     "gqa_ratio", "not a multiple of gqa_ratio 4"),
    ("q_heads_without_kv_heads", {"num_kv_heads": DROP}, "num_kv_heads", "go together"),
    ("kv_heads_without_q_heads", {"num_q_heads": DROP}, "num_q_heads", "go together"),
    ("no_heads_at_all", {"num_q_heads": DROP, "num_kv_heads": DROP}, "num_q_heads", "is required"),
    ("window_for_causal", {"window": 4096}, "window", "only applies to sliding-window masks"),
    ("window_for_document_causal", {"mask": "document", "window": 4096}, "window", "only applies"),
    ("window_missing_for_sliding_window", {"mask": "sliding_window"}, "window", "is required"),
    ("window_null_for_sliding_window", {"mask": "sliding_window", "window": None}, "window",
     "is required"),
    ("window_missing_for_document_swa", {"mask": "document", "document_mask": "sliding_window"},
     "window", "is required"),
    ("document_mask_on_causal", {"document_mask": "causal"}, "document_mask",
     "only applies to mask: document"),
    ("document_mask_document", {"mask": "document", "document_mask": "document"}, "document_mask",
     "must be one of none, causal, sliding_window"),
    ("mask_unknown", {"mask": "alibi"}, "mask", "must be one of"),
    ("mask_missing", {"mask": DROP}, "mask", "is required"),
    ("causal_alignment_unknown", {"causal_alignment": "center"}, "causal_alignment",
     "bottom_right, top_left"),
    ("fp8_with_backward", {"dtypes": ["bf16", "fp8_e4m3"], "targets": "sm90", "families": ["fwd", "bwd"]},
     "families", "bwd: fp8_e4m3 kernels are forward-only (inference)"),
    ("dtype_unknown", {"dtypes": ["bf16", "fp32"]}, "dtypes", "unknown value 'fp32'"),
    ("dtype_twice", {"dtypes": ["bf16", "bf16"]}, "dtypes", "listed twice"),
    ("dtypes_empty", {"dtypes": []}, "dtypes", "non-empty list"),
    ("dtypes_missing", {"dtypes": DROP}, "dtypes", "is required"),
    ("target_unknown", {"targets": "sm75"}, "targets", "unknown value 'sm75'"),
    ("targets_missing", {"targets": DROP}, "targets", "is required"),
    ("family_unknown", {"families": ["fwd", "prefill"]}, "families", "unknown value 'prefill'"),
    ("name_not_identifier", {"name": "1st kernel"}, "name", "identifier"),
]


@pytest.mark.parametrize("changes,field,words", [r[1:] for r in ENTRY_ROWS],
                         ids=[r[0] for r in ENTRY_ROWS])
def test_bad_entry_field(tmp_path, changes, field, words):
    bad = entry(**{"name": "bad", **changes})
    path = write_spec(tmp_path, {"model": "m", "kernels": [GOOD, bad]})
    err = spec_error(path)
    assert len(err.problems) == 1, f"expected one problem, got:\n{err}"
    msg = err.problems[0]
    label = f"kernel {bad['name']!r} (entry 1)"
    assert msg.startswith(f"{path}: {label}: field '{field}': "), msg
    assert words in msg, msg
    assert str(err) == msg


# entries whose name cannot label them are named by index alone
NAMELESS_ROWS = [
    ("name_missing", {"name": DROP}, "is required"),
    ("name_null", {"name": None}, "is required"),
    ("name_list", {"name": ["bad"]}, "identifier"),
    ("name_int", {"name": 7}, "identifier"),
]


@pytest.mark.parametrize("changes,words", [r[1:] for r in NAMELESS_ROWS],
                         ids=[r[0] for r in NAMELESS_ROWS])
def test_bad_name_is_labelled_by_index(tmp_path, changes, words):
    path = write_spec(tmp_path, {"kernels": [GOOD, entry(**changes)]})
    err = spec_error(path)
    assert len(err.problems) == 1, str(err)
    assert err.problems[0].startswith(f"{path}: entry 1: field 'name': "), str(err)
    assert words in str(err)


def test_name_with_trailing_newline_is_rejected(tmp_path):
    # a "\n" in a name would end the `# spec: file#name` comment line of the generated header
    path = write_spec(tmp_path, 'kernels:\n  - {name: "bad\\n", head_dim: 64, gqa_ratio: 1, '
                                'mask: none, dtypes: fp16, targets: sm80}\n')
    err = spec_error(path)
    assert f"{path}: kernel 'bad\\n' (entry 0): field 'name'" in str(err)


TOP_ROWS = [
    ("unknown_top_level_key", {"model": "m", "version": 2, "kernels": [GOOD]},
     "top level: field 'version': unknown field"),
    ("model_not_string", {"model": ["m"], "kernels": [GOOD]}, "top level: field 'model'"),
    ("description_not_string", {"description": {"a": 1}, "kernels": [GOOD]},
     "top level: field 'description'"),
    ("kernels_empty", {"model": "m", "kernels": []}, "top level: field 'kernels': must be a non-empty list"),
    ("kernels_missing", {"model": "m"}, "top level: field 'kernels'"),
    ("kernels_mapping", {"kernels": GOOD}, "top level: field 'kernels'"),
    ("top_level_list", [GOOD], "top level must be a mapping"),
    ("empty_file", "", "top level must be a mapping"),
    ("entry_not_mapping", {"kernels": [GOOD, "llama"]}, "entry 1: must be a mapping"),
    ("duplicate_names", {"kernels": [GOOD, entry(dtypes=["fp16"])]},
     "kernel 'k0': field 'name': used by more than one entry"),
]


@pytest.mark.parametrize("doc,words", [r[1:] for r in TOP_ROWS], ids=[r[0] for r in TOP_ROWS])
def test_bad_top_level(tmp_path, doc, words):
    path = write_spec(tmp_path, doc)
    err = spec_error(path)
    assert len(err.problems) == 1, str(err)
    assert err.problems[0].startswith(f"{path}: "), str(err)
    assert words in str(err)


def test_invalid_yaml_names_file_and_line(tmp_path):
    path = write_spec(tmp_path, "kernels:\n  - name: k0\n    head_dim: [128\n    mask: causal\n")
    err = spec_error(path)
    assert str(err).startswith(f"{path}: not valid YAML (line "), str(err)


@pytest.mark.parametrize("text, line, words", [
    # a bracket or quote left open: the parser notices on a later line, the message names the first
    ("kernels:\n  - name: k0\n    head_dim: [128\n    mask: causal\n", 3, "a flow sequence opens here"),
    ("kernels:\n  - name: k0\n    mask: {x: 1\n\n", 3, "a flow mapping opens here"),
    ('kernels:\n  - name: "k0\n    head_dim: 64\n', 2, "a quoted scalar opens here"),
    # a line indented wrong is the line named
    ("kernels:\n  - name: k0\n    head_dim: 64\n   mask: causal\n", 4, "expected <block end>"),
    ("kernels:\n  - name: k0\n     head_dim: 64\n", 3, "mapping values are not allowed"),
])
def test_yaml_errors_name_the_line_to_fix(tmp_path, text, line, words):
    path = write_spec(tmp_path, text)
    err = str(spec_error(path))
    assert err.startswith(f"{path}: not valid YAML (line {line}, column "), err
    assert words in err, err


@pytest.mark.parametrize("key, guess", [("head_dims", "head_dim"), ("dtype", "dtypes"), ("mask_kind", "mask")])
def test_an_unknown_field_gets_a_did_you_mean(tmp_path, key, guess):
    good = entry()
    path = write_spec(tmp_path, {"kernels": [{**good, key: good.get(guess, 1)}]})
    err = str(spec_error(path))
    assert f"field '{key}': unknown field (did you mean '{guess}'? known: " in err, err


def test_an_unknown_field_far_from_any_gets_the_list_only(tmp_path):
    path = write_spec(tmp_path, {"kernels": [{**entry(), "zzzz": 1}]})
    err = str(spec_error(path))
    assert "did you mean" not in err and "unknown field (known: name, " in err, err


def test_key_given_twice_is_an_error_not_last_wins(tmp_path):
    text = yaml.safe_dump({"kernels": [GOOD]}, sort_keys=False).replace(
        "head_dim: 128", "head_dim: 128\n  head_dim: 64")
    path = write_spec(tmp_path, text)
    err = spec_error(path)
    assert f"{path}: not valid YAML (line 4" in str(err), str(err)
    assert "'head_dim' is given twice" in str(err)


def test_every_problem_is_listed_at_once(tmp_path):
    path = write_spec(tmp_path, {"kernels": [entry(name="a", head_dim=300),
                                             entry(name="b", mask="sliding_window", dtypes=["fp32"])]})
    err = spec_error(path)
    assert err.problems == [
        f"{path}: kernel 'a' (entry 0): field 'head_dim': must be in [8, 256], got 300",
        f"{path}: kernel 'b' (entry 1): field 'window': is required for a sliding-window mask",
        f"{path}: kernel 'b' (entry 1): field 'dtypes': unknown value 'fp32' (expected fp16, bf16, fp8_e4m3)",
    ]


def test_missing_file_and_empty_folder(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="no such spec file or folder"):
        spec_files(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="no \\*.yaml spec files"):
        spec_files(tmp_path)


# --------------------------------------------------------------------------------------------------
# good files


@pytest.mark.parametrize("path", sorted(SPECS_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_committed_spec_loads(path):
    f = load_spec(path)
    specs = f.kernel_specs()
    assert specs, f"{path} expands to no kernels"
    uris = [k.uri for k in specs]
    assert len(set(uris)) == len(uris), f"{path}: a uri appears twice: {uris}"
    assert isinstance(f.model, str) and f.model


def test_specs_folder_lists_every_yaml():
    assert [p.name for p in spec_files(SPECS_DIR)] == sorted(p.name for p in SPECS_DIR.glob("*.yaml"))
    assert len(spec_files(SPECS_DIR)) >= 4


def test_llama_expands_to_expected_kernels():
    f = load_spec(SPECS_DIR / "llama.yaml")
    assert f.model == "Llama-3-8B"
    dense, packed, fp8 = f.entries
    assert [k.uri for k in fp8.kernel_specs()] == ["attn_fwd_fp8_e4m3_hd128_gqa4_causal_sm90"]
    assert (dense.name, dense.head_dim_qk, dense.head_dim_v, dense.num_q_heads, dense.num_kv_heads,
            dense.gqa_ratio) == ("llama3_8b", 128, 128, 32, 8, 4)
    assert (dense.mask, dense.window, dense.causal_alignment, dense.softcap, dense.softmax_scale) == (
        "causal", None, "bottom_right", 0.0, None)
    assert (packed.name, packed.mask, packed.document_mask) == ("llama3_8b_packed", "document", "causal")
    # per entry: families x dtypes x targets, in the order the file lists them
    combos = [f"{fam}_{dt}_hd128_gqa4_{{mask}}_{tg}" for fam in ("fwd", "bwd", "decode", "prefill_paged")
              for dt in ("bf16", "fp16") for tg in ("sm80", "sm90")]
    assert [k.uri for k in dense.kernel_specs()] == ["attn_" + c.format(mask="causal") for c in combos]
    # packed documents get no decode or paged prefill kernels (they read a KV cache)
    assert [k.uri for k in packed.kernel_specs()] == ["attn_" + c.format(mask="doc_causal") for c in combos
                                                      if not c.startswith(("decode", "prefill_paged"))]
    assert [k.uri for k in f.kernel_specs()] == [k.uri for e in (dense, packed, fp8) for k in e.kernel_specs()]
    assert f.kernel_specs()[0] == KernelSpec(family="fwd", dtype="bf16", target="sm80", head_dim_qk=128,
                                             head_dim_v=128, gqa_ratio=4, mask="causal")
    assert packed.kernel_specs()[0] == KernelSpec(family="fwd", dtype="bf16", target="sm80", head_dim_qk=128,
                                                  head_dim_v=128, gqa_ratio=4, mask="causal", varlen=True)


def test_gemma2_softcap_and_window_are_entry_values():
    f = load_spec(SPECS_DIR / "gemma2.yaml")
    local, glob = f.entries
    assert (local.mask, local.window, local.softcap, local.softmax_scale) == (
        "sliding_window", 4096, 50.0, 0.0625)
    assert glob.window is None
    assert {k.uri for k in f.kernel_specs()} >= {
        "attn_fwd_bf16_hd256_gqa2_swa_softcap_sm90", "attn_fwd_fp16_hd256_gqa2_causal_softcap_sm80"}


def test_head_dim_qk_and_v(tmp_path):
    f = load_entry(tmp_path, head_dim=DROP, head_dim_qk=192, head_dim_v=128)
    (k,) = f.kernel_specs()
    assert (k.head_dim_qk, k.head_dim_v) == (192, 128)
    assert k.uri == "attn_fwd_bf16_hd192x128_gqa4_causal_sm80"
    # head_dim_v defaults to head_dim_qk
    (k,) = load_entry(tmp_path, head_dim=DROP, head_dim_qk=96).kernel_specs()
    assert (k.head_dim_qk, k.head_dim_v, k.uri) == (96, 96, "attn_fwd_bf16_hd96_gqa4_causal_sm80")


def test_gqa_ratio_alone(tmp_path):
    f = load_entry(tmp_path, num_q_heads=DROP, num_kv_heads=DROP, gqa_ratio=8)
    (e,) = f.entries
    assert (e.gqa_ratio, e.num_q_heads, e.num_kv_heads) == (8, None, None)
    assert f.kernel_specs()[0].uri == "attn_fwd_bf16_hd128_gqa8_causal_sm80"
    # consistent with the head counts is fine
    assert load_entry(tmp_path, gqa_ratio=4).entries[0].gqa_ratio == 4
    # one head count + the ratio is fine too
    e = load_entry(tmp_path, num_kv_heads=DROP, num_q_heads=32, gqa_ratio=4).entries[0]
    assert (e.gqa_ratio, e.num_q_heads, e.num_kv_heads) == (4, 32, None)


@pytest.mark.parametrize("changes,uri", [
    ({"mask": "document"}, "attn_fwd_bf16_hd128_gqa4_doc_causal_sm80"),
    ({"mask": "document", "document_mask": "none"}, "attn_fwd_bf16_hd128_gqa4_doc_full_sm80"),
    ({"mask": "document", "document_mask": "sliding_window", "window": 256},
     "attn_fwd_bf16_hd128_gqa4_doc_swa_sm80"),
])
def test_document_mask_expands_to_varlen(tmp_path, changes, uri):
    f = load_entry(tmp_path, **changes)
    (k,) = f.kernel_specs()
    assert k.varlen is True
    assert k.mask == changes.get("document_mask", "causal")
    assert k.uri == uri


def test_non_document_masks_are_not_varlen(tmp_path):
    for mask, extra in (("none", {}), ("causal", {}), ("sliding_window", {"window": 64})):
        (k,) = load_entry(tmp_path, mask=mask, **extra).kernel_specs()
        assert (k.mask, k.varlen) == (mask, False)


def test_defaults(tmp_path):
    f = load_entry(tmp_path, families=DROP)
    (e,) = f.entries
    assert e.causal_alignment == "bottom_right"
    # a trainable kernel, and its decode and paged prefill kernels, unless the entry says otherwise
    assert e.families == ("fwd", "bwd", "decode", "prefill_paged")
    assert (e.softcap, e.softmax_scale, e.window, e.document_mask) == (0.0, None, None, None)
    assert f.model is None
    fwd, bwd, dec, pre = f.kernel_specs()
    assert (fwd.family, fwd.softcap, fwd.varlen) == ("fwd", False, False)
    assert bwd == fwd.replace(family="bwd") and dec == fwd.replace(family="decode")
    assert pre == fwd.replace(family="prefill_paged")


def test_null_means_left_out(tmp_path):
    a = load_entry(tmp_path, softmax_scale=None, softcap=None, causal_alignment=None, families=None)
    b = load_entry(tmp_path, families=DROP)
    assert a.entries == b.entries


def test_single_strings_and_expansion_order(tmp_path):
    f = load_entry(tmp_path, dtypes="fp16", targets=["sm90", "sm80"], families=["bwd", "fwd"])
    assert [k.uri for k in f.kernel_specs()] == [
        "attn_bwd_fp16_hd128_gqa4_causal_sm90",
        "attn_bwd_fp16_hd128_gqa4_causal_sm80",
        "attn_fwd_fp16_hd128_gqa4_causal_sm90",
        "attn_fwd_fp16_hd128_gqa4_causal_sm80",
    ]


def test_fp8_entries(tmp_path):
    """fp8_e4m3 entries build the fwd_fp8 family only (a default family list keeps bwd and decode
    for the entry's other dtypes); sm80, or a backward or decode asked for explicitly, is an error
    naming file, entry and field."""
    path = write_spec(tmp_path, {"kernels": [GOOD, entry(name="f8", dtypes=["bf16", "fp8_e4m3"], targets="sm90",
                                                         families=DROP)]})
    specs = load_spec(path).entries[1].kernel_specs()
    assert [(s.family, s.dtype) for s in specs] == [("fwd", "bf16"), ("fwd_fp8", "fp8_e4m3"), ("bwd", "bf16"),
                                                    ("decode", "bf16"), ("prefill_paged", "bf16")]
    assert specs[1].uri == "attn_fwd_fp8_e4m3_hd128_gqa4_causal_sm90"
    path = write_spec(tmp_path, {"kernels": [GOOD, entry(name="f8", dtypes=["fp8_e4m3"], targets=["sm80", "sm90"],
                                                         families=["fwd", "decode"])]})
    assert spec_error(path).problems == [
        f"{path}: kernel 'f8' (entry 1): field 'dtypes': fp8_e4m3 needs target sm90 only (sm80 has "
        "no fp8 tensor cores); split the entry or drop sm80 from targets",
        f"{path}: kernel 'f8' (entry 1): field 'families': decode: fp8_e4m3 kernels are forward-only "
        "(inference); give fp8_e4m3 an entry of its own with families: fwd (or leave families out)",
    ]
    with pytest.raises(ValueError, match="family fwd_fp8 and dtype fp8_e4m3 go together"):
        KernelSpec(family="fwd", dtype="fp8_e4m3", target="sm90", head_dim_qk=128, head_dim_v=128, gqa_ratio=4,
                   mask="causal")


def test_duplicate_name_is_reported_with_the_other_problems(tmp_path):
    """The second 'dup' is broken too: the duplicate is still reported, next to its problem."""
    path = write_spec(tmp_path, {"kernels": [entry(name="dup"), entry(name="dup", head_dim=300),
                                             entry(name="other", mask="alibi")]})
    assert spec_error(path).problems == [
        f"{path}: kernel 'dup' (entry 1): field 'head_dim': must be in [8, 256], got 300",
        f"{path}: kernel 'other' (entry 2): field 'mask': must be one of none, causal, sliding_window, "
        "document, got 'alibi'",
        f"{path}: kernel 'dup': field 'name': used by more than one entry (entries 0, 1)",
    ]


def test_launch_time_values_do_not_change_the_kernel(tmp_path):
    """Window width, softcap value, scale and causal alignment are launch-time arguments."""
    base = load_entry(tmp_path, mask="sliding_window", window=128, softcap=30.0).kernel_specs()
    other = load_entry(tmp_path, mask="sliding_window", window=4096, softcap=50.0, softmax_scale=0.1,
                       causal_alignment="top_left").kernel_specs()
    assert base == other
    # ... while softcap on/off is structure
    (no_cap,) = load_entry(tmp_path, mask="sliding_window", window=128, softcap=0).kernel_specs()
    assert no_cap != base[0] and no_cap.softcap is False and base[0].softcap is True


def test_yaml_merge_keys_may_share_defaults(tmp_path):
    text = """
defaults: &d {head_dim: 128, gqa_ratio: 4, mask: causal, dtypes: bf16, targets: sm80, families: fwd}
kernels:
  - {<<: *d, name: a}
  - {<<: *d, name: b, mask: none}
"""
    # 'defaults' is not a top-level field
    err = spec_error(write_spec(tmp_path, text))
    assert "top level: field 'defaults'" in str(err)
    text = text.replace("defaults: &d ", "description: &d ")
    with pytest.raises(SpecError, match="field 'description': must be a string"):
        load_spec(write_spec(tmp_path, text))
    text = """
kernels:
  - &a {name: a, head_dim: 128, gqa_ratio: 4, mask: causal, dtypes: bf16, targets: sm80, families: fwd}
  - {<<: *a, name: b, mask: none}
"""
    f = load_spec(write_spec(tmp_path, text))
    assert [k.uri for k in f.kernel_specs()] == ["attn_fwd_bf16_hd128_gqa4_causal_sm80",
                                                 "attn_fwd_bf16_hd128_gqa4_full_sm80"]


def test_parse_spec_default_path():
    with pytest.raises(SpecError, match="^<string>: top level: field 'kernels'"):
        parse_spec("model: x\n")


@pytest.mark.parametrize("bad", [
    {"dtype": "fp8_e4m3", "target": "sm80"},
    {"head_dim_qk": 300},
    {"mask": "document"},
    {"gqa_ratio": 0},
    {"family": "prefill"},
    {"family": "decode", "varlen": True},
])
def test_kernel_spec_checks_itself(bad):
    fields = dict(family="fwd", dtype="fp16", target="sm90", head_dim_qk=64, head_dim_v=64,
                  gqa_ratio=1, mask="causal")
    fields.update(bad)
    with pytest.raises(ValueError, match="invalid KernelSpec"):
        KernelSpec(**fields)


# --------------------------------------------------------------------------------------------------
# docs/spec.md stays true to the validator

DOC = REPO_ROOT / "docs" / "spec.md"


def doc_block(marker: str) -> str:
    """The fenced block right after `<!-- example: marker -->` in docs/spec.md."""
    text = DOC.read_text()
    start = text.index(f"<!-- example: {marker} -->")
    body = text[text.index("\n", text.index("```", start)) + 1:]
    return body[:body.index("```")]


def test_doc_error_example_is_what_the_validator_says():
    with pytest.raises(SpecError) as info:
        parse_spec(doc_block("bad"), "specs/bad.yaml")
    first, *lines = doc_block("bad-output").splitlines()
    assert info.value.problems == lines
    assert first == f"attngen build: {len(lines)} problem(s), nothing written:"


def test_doc_full_example_validates():
    f = parse_spec(doc_block("full"), "docs/spec.md")
    uris = [k.uri for k in f.kernel_specs()]
    assert len(uris) == len(set(uris)) == 13
    assert {"attn_bwd_fp16_hd128_gqa4_swa_softcap_sm90", "attn_fwd_bf16_hd128_gqa4_causal_sm90",
            "attn_bwd_bf16_hd192x128_gqa1_doc_causal_sm80"} <= set(uris)


def test_doc_tables_list_every_field():
    from attngen.spec.loading import _ENTRY_FIELDS, _TOP_FIELDS

    text = DOC.read_text()
    for field in [*_ENTRY_FIELDS, *_TOP_FIELDS]:
        assert f"| `{field}`" in text, f"docs/spec.md has no table row for {field!r}"


# --------------------------------------------------------------------------------------------------
# a set of spec files (what one `attngen build` validates)


def test_load_specs_reports_every_problem_of_every_file(tmp_path):
    """Not only the first bad file's problems: every file's, in order, and a missing target too."""
    a = write_spec(tmp_path, {"kernels": [entry(name="a", head_dim=300)]}, "a.yaml")
    ok = write_spec(tmp_path, {"kernels": [entry(name="fine")]}, "ok.yaml")
    b = write_spec(tmp_path, {"kernels": [entry(name="b", dtypes=["fp8_e4m3"], targets="sm90", families="bwd"),
                                          entry(name="b2", mask=DROP)]}, "b.yaml")
    c = write_spec(tmp_path, "kernels: [\n", "c.yaml")
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_specs([a, ok, missing, b, c])
    problems = info.value.problems
    assert problems[:4] == [
        f"{missing}: no such spec file or folder",
        f"{a}: kernel 'a' (entry 0): field 'head_dim': must be in [8, 256], got 300",
        f"{b}: kernel 'b' (entry 0): field 'families': bwd: fp8_e4m3 kernels are forward-only (inference); "
        "give fp8_e4m3 an entry of its own with families: fwd (or leave families out)",
        f"{b}: kernel 'b2' (entry 1): field 'mask': is required (one of none, causal, sliding_window, document)",
    ]
    assert len(problems) == 5 and problems[4].startswith(f"{c}: not valid YAML (line "), problems
    assert str(info.value) == "\n".join(problems)


def test_load_specs_duplicate_names_across_files(tmp_path):
    first = write_spec(tmp_path, {"kernels": [entry(name="shared"), entry(name="only_a", dtypes=["fp16"])]},
                       "a.yaml")
    # the second file's entry is broken as well: the duplicate is reported with its problem
    second = write_spec(tmp_path, {"kernels": [entry(name="x", dtypes=["fp16"]),
                                               entry(name="shared", head_dim=4)]}, "b.yaml")
    with pytest.raises(SpecError) as info:
        load_specs([first, second])
    assert info.value.problems == [
        f"{second}: kernel 'shared' (entry 1): field 'head_dim': must be in [8, 256], got 4",
        f"{second}: kernel 'shared' (entry 1): field 'name': also used by {first} (entry 0); entry "
        "names must be unique across the spec files of one build",
    ]
    # each file alone is fine apart from that
    assert [e.name for e in load_specs([first])[0].entries] == ["shared", "only_a"]


def test_load_specs_counts_a_file_named_twice_once(tmp_path):
    path = write_spec(tmp_path, {"kernels": [GOOD]})
    (loaded,) = load_specs([tmp_path, path, tmp_path / ".." / tmp_path.name / path.name])
    assert loaded.path == str(path)


def test_load_specs_rejects_two_files_with_the_same_label(tmp_path):
    (tmp_path / "one" / "specs").mkdir(parents=True)
    (tmp_path / "two" / "specs").mkdir(parents=True)
    a = write_spec(tmp_path / "one" / "specs", {"kernels": [entry(name="a")]}, "m.yaml")
    b = write_spec(tmp_path / "two" / "specs", {"kernels": [entry(name="b")]}, "m.yaml")
    with pytest.raises(SpecError) as info:
        load_specs([a, b])
    (msg,) = info.value.problems
    assert msg.startswith(f"{b}: has the same folder and file name (specs/m.yaml) as {a}"), msg


def test_committed_specs_load_as_one_set():
    files = load_specs([SPECS_DIR])
    assert [Path(f.path).name for f in files] == [p.name for p in spec_files(SPECS_DIR)]


def test_spec_label_is_folder_and_name_however_the_path_is_written(tmp_path, monkeypatch):
    path = write_spec(tmp_path, {"kernels": [GOOD]}, "m.yaml")
    monkeypatch.chdir(tmp_path.parent)
    written = [path, str(path), Path(tmp_path.name) / "m.yaml",
               f"{tmp_path.name}/../{tmp_path.name}/m.yaml", f"./{tmp_path.name}/m.yaml"]
    assert {spec_label(p) for p in written} == {f"{tmp_path.name}/m.yaml"}
    monkeypatch.chdir(tmp_path)
    assert spec_label("m.yaml") == f"{tmp_path.name}/m.yaml"
    assert spec_label(SPECS_DIR / "llama.yaml") == "specs/llama.yaml"
    assert spec_label("/m.yaml") == "m.yaml"
