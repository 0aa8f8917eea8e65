"""The fp8 forward family (`fwd_fp8`, templates/attn_fwd_fp8.py.jinja): attention with e4m3
operands on sm90, inference only. Its launches (quantization prologue and attention), the random
signs of the rotation, the buffers, and its Family record; its launch config, validity filter,
search space, defaults and template values are in attngen.families.fwd_fp8_config (and named here
too), its tuning hooks in fwd_fp8_tuning.

A call quantizes Q, K and V in blocks of SCALE_BLOCK rows per head (one fp32 descale per block),
Q and K after the same random orthogonal rotation M = diag(s) H / sqrt(w) per diagonal block of
the head dim (incoherent processing: (QM)(KM)^T = QK^T, and an outlier feature is spread over all
features before quantization), V transposed (keys contiguous) for the P.V product. Head dims that
are not a power of two (after rounding up to 16) use a block-diagonal Hadamard: its blocks are the
binary decomposition (80 = 64 + 16, 96 = 64 + 32, 192 = 128 + 64), so the rotation mixes only real
columns and zero padding up to the next multiple of 16.
"""

from __future__ import annotations

import functools
from types import ModuleType

from attngen.families.base import SMEM_LIMIT, Family, require_valid
from attngen.families.fwd_fp8_config import (  # noqa: F401 (the family's names, here as before)
    SCALE_BLOCK, ROTATION_SEED, E4M3_MAX, Fp8Config, qk_width, rotation_blocks, _tile, ROT_TILE,
    rotation_sums, context, smem_bytes, check_fp8, SPACE, default_fp8_config, variants, WS_FP8_HEAD_DIMS,
    ws_fp8, WS_FP8_DEFAULT, WS_FP8_DEFAULT_WIDE, WS_FP8_ONE, WS_FP8_SHORT, WS_FP8_SHORT_CAUSAL,
    ws_fp8_preferred, ws_fp8_default, ws_smem_bytes, check_ws_fp8, ws_fallback, triton_fp8_config,
    ws_fp8_maxnreg, portable_fp8)
from attngen.kernels.common import MaskArgs
from attngen.kernels.descriptors import tma_descriptors
from attngen.kernels.launch import Launch, call_extent, has_entry, lse_strides, needs_int64, programs, strides4
# pdl(t): programmatic dependent launch on t's device (sm90): the prologue lets the attention
# kernel launch as its programs leave, and the attention kernel waits for it inside
from attngen.kernels.launch import pdl
from attngen.spec import KernelSpec

PROLOGUE = ("_fp8_quant_qkv", "_fp8_quant_qk", "_fp8_quant_v")  # prologue_launch's, quant_launches' entry points


@functools.lru_cache(maxsize=64)
def _signs_cpu(width: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (width,), generator=g) * 2 - 1).float()


def hadamard(n: int, dtype=None):
    """The Walsh-Hadamard matrix of order n (a power of two), entries +-1 (Sylvester's order)."""
    import torch

    h = torch.ones(1, 1, dtype=dtype or torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def signed_hadamard(width: int, seed: int):
    """The prologue's rotation before its 1 / sqrt(w) factors (width x width, float64): diag(s) H_w
    on each diagonal block of rotation_blocks(width), zeros elsewhere; entries +-1, exact in any
    16-bit dtype."""
    import torch

    m = torch.zeros(width, width, dtype=torch.float64)
    for off, bw in rotation_blocks(width):
        m[off:off + bw, off:off + bw] = hadamard(bw)
    return _signs_cpu(width, seed).double()[:, None] * m


_ROT: dict = {}


def rotation(width: int, seed: int, dtype, device):
    """signed_hadamard(width, seed) in the inputs' 16-bit `dtype` on `device` (the Q / K prologue's
    Rot), one copy per (width, seed, dtype, device)."""
    key = (width, seed, dtype, str(device))
    t = _ROT.get(key)
    if t is None:
        t = _ROT[key] = signed_hadamard(width, seed).to(dtype).to(device)
    return t


def buffers(spec: KernelSpec, q, k, v, packed: bool, max_q: int = 0, max_k: int = 0, cu_q=None):
    """Shapes of a call's fp8 tensors and descales: {name: (shape, 'fp8' | 'fp32')}. Dense q
    (B, Hq, Sq, D) views; packed q (Tq, Hq, D). V^T's keys are padded to a multiple of 16."""
    w = qk_width(spec)
    if packed:
        docs = cu_q.numel() - 1
        tq, hq = q.shape[0], q.shape[1]
        tk, hkv = k.shape[0], k.shape[1]
        nq, nk = -(-max(max_q, 1) // SCALE_BLOCK), -(-max(max_k, 1) // SCALE_BLOCK)
        return {"Q8": ((tq, hq, w), "fp8"), "K8": ((tk, hkv, w), "fp8"),
                "Vt": ((hkv, v.shape[2], -(-tk // 16) * 16), "fp8"),
                "QScale": ((docs, hq, nq), "fp32"), "KScale": ((docs, hkv, nk), "fp32"),
                "VScale": ((docs, hkv, nk), "fp32")}
    B, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    nq, nk = -(-sq // SCALE_BLOCK), -(-sk // SCALE_BLOCK)
    return {"Q8": ((B, hq, sq, w), "fp8"), "K8": ((B, hkv, sk, w), "fp8"),
            "Vt": ((B, hkv, v.shape[3], -(-sk // 16) * 16), "fp8"),
            "QScale": ((B, hq, max(nq, 1)), "fp32"), "KScale": ((B, hkv, max(nk, 1)), "fp32"),
            "VScale": ((B, hkv, max(nk, 1)), "fp32")}


def _vt_strides(vt, packed: bool) -> dict:
    """V^T (B, H, Dv, S_pad) or packed (H, Dv, T_pad): keys contiguous."""
    if packed:
        return {"stride_vz": 0, "stride_vh": vt.stride(0), "stride_vk": vt.stride(1)}
    return {"stride_vz": vt.stride(0), "stride_vh": vt.stride(1), "stride_vk": vt.stride(2)}


def _scale_strides(prefix: str, s) -> dict:
    return {f"stride_{prefix}sz": s.stride(0), f"stride_{prefix}sh": s.stride(1), f"stride_{prefix}sb": s.stride(2)}


def key_order16(mod: ModuleType, launches: list[Launch]) -> bool:
    """Whether the attention launches read V^T's keys in the Gluon kernel's order within each 16
    (the prologue's PERM16, permute_keys16): the Gluon kernel runs and its module says so."""
    return getattr(mod, "WS_KEY_ORDER16", False) and any(la.fn.__name__ == "_attn_fwd_fp8_ws" for la in launches)


def permute_keys16(vt):
    """V^T (..., S_pad) in natural key order -> the Gluon kernel's: position 4t + 2h + b of each 16
    holds key 8h + 2t + b, i.e. the key index's digits (h, t, b) (radix 2, 4, 2) reordered to
    (t, h, b) -- a view and one copy."""
    return vt.unflatten(-1, (vt.shape[-1] // 16, 2, 4, 2)).transpose(-3, -2).flatten(-4)


def transpose_v(v, vt, perm16: bool) -> None:
    """A caller's e4m3 V (B, H, S, D) into V^T (B, H, D, S_pad) (keys contiguous, zero padding),
    in the Gluon kernel's key order when perm16: one copy for the whole groups of 16 keys, one
    small one for the last, partial group."""
    import torch

    src, dst = v.view(torch.uint8).transpose(2, 3), vt.view(torch.uint8)
    S, full = src.shape[-1], src.shape[-1] // 16 * 16
    if not perm16:
        dst[..., :S].copy_(src)
        dst[..., S:].zero_()
        return
    if full:
        dst[..., :full].unflatten(-1, (full // 16, 4, 2, 2)).copy_(
            src[..., :full].unflatten(-1, (full // 16, 2, 4, 2)).transpose(-3, -2))
    if S > full:
        tail = dst.new_zeros(*dst.shape[:-1], 16)
        tail[..., :S - full].copy_(src[..., full:])
        dst[..., full:full + 16].copy_(permute_keys16(tail))


def quant_warps(width: int) -> int:
    """The prologue's warps for a block of SCALE_BLOCK rows x `width` columns: 4 for one Hadamard
    block of at most 128 columns (167 registers at hd128, no spills), else 8 (245 at hd256; 4
    spill). H200, the K / V launch, B1 H16, µs (benchmarks/ab/h200_ab_fp8_prologue_warps_2026-12-04.json):
    hd128 S16k 63 / 69 / 74 at 4 / 8 / 16 warps, S4k 23 / 23 / 25; hd256 S16k 189 / 196 / 214 at
    8 / 16 / 32. Widths made of several blocks (80 = 64 + 16, 96 = 64 + 32, ...) keep 8: at 4 warps
    ptxas 12.8 (Triton 3.6's) builds the 32-column block's wgmma descriptors at 96 and 112 columns
    from a uniform register nothing writes (wrong Q8 / K8 and illegal addresses on the H200;
    attngen.bench.probe.undefined_uniform_reads, tests/codegen/test_sass_uniform_registers.py),
    and at 8 every width compiles cleanly and ran
    (tests/gpu/test_gpu_fp8.py::test_gpu_fp8_prologue_every_width)."""
    return 4 if width <= 128 and len(rotation_blocks(width)) == 1 else 8


def _rows_launch(mod: ModuleType, entry: str, x, tgt, name: str, cu, max_s: int, extra: dict,
                 warps: int, use_pdl: bool | None = None) -> Launch:
    """A launch of one of the prologue's row kernels (templates/attn_fwd_fp8.py.jinja's
    quant_kernel: `entry`) from x (dense (B, H, S, D) or packed (T, H, D)) into tgt, V^T (keys
    contiguous) for name "v"; `extra`: the kernel's own parameters (descales, rotation, constexprs)."""
    packed = cu is not None
    if packed:
        zh, seqlen, store_len = (cu.numel() - 1) * x.shape[1], 0, 0
        rows = max_s if x.shape[0] else 0
        xs = (0, x.stride(1), x.stride(0), x.stride(2))
        ys = ((0, tgt.stride(0), 1, tgt.stride(1)) if name == "v"
              else (0, tgt.stride(1), tgt.stride(0), tgt.stride(2)))
    else:
        zh, seqlen = x.shape[0] * x.shape[1], x.shape[2]
        rows = store_len = tgt.shape[3] if name == "v" else seqlen
        xs = x.stride()
        ys = ((tgt.stride(0), tgt.stride(1), 1, tgt.stride(2)) if name == "v" else tgt.stride())
    blocks = -(-rows // SCALE_BLOCK)
    values = {
        "X": x, "X8": tgt, "cu_seqlens": cu,
        "stride_xz": xs[0], "stride_xh": xs[1], "stride_xm": xs[2], "stride_xk": xs[3],
        "stride_yz": ys[0], "stride_yh": ys[1], "stride_ym": ys[2], "stride_yk": ys[3],
        "num_heads": x.shape[1], "seqlen": seqlen, "store_len": store_len, "num_blocks": blocks,
        "BLOCK": SCALE_BLOCK, "PDL": pdl(x) if use_pdl is None else use_pdl, **extra,
    }
    return Launch.of(mod, entry, programs(blocks, zh, name) if rows else 0, values, warps, 1)


def quant_launches(mod: ModuleType, spec: KernelSpec, q, k, v, bufs: dict, rot, cu_q=None, cu_k=None,
                   max_q: int = 0, max_k: int = 0, perm16: bool = False, use_pdl: bool | None = None) -> list[Launch]:
    """The prologue as three launches (prologue_launch fuses them): Q and K rotated (rot:
    rotation(qk_width, seed, q.dtype, device); None: no rotation) and quantized, V quantized and
    transposed, into `bufs` (buffers()' names -> tensors); perm16: V^T's keys in the Gluon
    kernel's order (key_order16 of the attention launches)."""
    out = []
    for x, name, cu, max_s in ((q, "q", cu_q, max_q), (k, "k", cu_k, max_k), (v, "v", cu_k, max_k)):
        scale = bufs[name.upper() + "Scale"]
        extra = {"Scale": scale, "stride_sz": scale.stride(0), "stride_sh": scale.stride(1),
                 **({"PERM16": perm16} if name == "v" else {"Rot": rot, "ROTATE": rot is not None})}
        tgt = bufs["Vt" if name == "v" else name.upper() + "8"]
        entry = "_fp8_quant_v" if name == "v" else "_fp8_quant_qk"
        warps = quant_warps(x.shape[-1] if name == "v" else qk_width(spec))
        out.append(_rows_launch(mod, entry, x, tgt, name, cu, max_s, extra, warps, use_pdl))
    return out


_FUSED_NAMES = {"X": "{t}", "X8": "{y}", "Scale": "{t8}Scale", "cu_seqlens": "cu_seqlens_{c}",
                "stride_xz": "stride_{t}z", "stride_xh": "stride_{t}h", "stride_xm": "stride_{t}m",
                "stride_xk": "stride_{t}k", "stride_yz": "stride_{t}8z", "stride_yh": "stride_{t}8h",
                "stride_ym": "stride_{t}8m", "stride_yk": "stride_{t}8k", "stride_sz": "stride_{t}sz",
                "stride_sh": "stride_{t}sh", "num_heads": "heads_{t}", "seqlen": "seqlen_{t}",
                "store_len": "store_{t}", "num_blocks": "blocks_{t}"}


def prologue_launch(mod: ModuleType, spec: KernelSpec, q, k, v, bufs: dict, rot, cu_q=None, cu_k=None,
                    max_q: int = 0, max_k: int = 0, perm16: bool = False, use_pdl: bool | None = None,
                    quant_q: bool = True) -> Launch:
    """The prologue in one launch (`_fp8_quant_qkv`: quant_launches' three kernels as one grid,
    Q's programs first, then K's, then V's), its tensors under the attention plan's names (q, k,
    v, Q8, K8, Vt, QScale, KScale, VScale, Rot, cu_seqlens_q, cu_seqlens_k). use_pdl (None: pdl(q))
    lets the attention launch start as the prologue's programs leave. quant_q=False: Q is left out
    (no programs; the attention kernel quantizes it, q_in_kernel)."""
    parts = quant_launches(mod, spec, q, k, v, bufs, rot, cu_q, cu_k, max_q, max_k, perm16, use_pdl)
    if not quant_q:
        parts[0].grid = 0
    values = {"Rot": rot, "progs_q": parts[0].grid, "progs_k": parts[1].grid, "BLOCK": SCALE_BLOCK,
              "ROTATE": rot is not None, "PERM16": perm16, "PDL": parts[0].values["PDL"]}
    for la, t, y, c in zip(parts, "qkv", ("Q8", "K8", "Vt"), "qkk"):
        names = {n: f.format(t=t, y=y, t8=t.upper(), c=c) for n, f in _FUSED_NAMES.items()}
        values.update({names[n]: val for n, val in la.values.items() if n in names})
    return Launch.of(mod, "_fp8_quant_qkv", sum(la.grid for la in parts), values,
                     max(la.num_warps for la in parts), 1)


def copy_v_launch(mod: ModuleType, v, vt, perm16: bool, use_pdl: bool | None = None) -> Launch:
    """A caller's e4m3 V (B, H, S, D) into V^T (B, H, D, S_pad) (keys contiguous, zero padding; in
    the Gluon kernel's key order when perm16) by the module's copy kernel `_fp8_copy_v`."""
    # 8 warps: B1 H16 S16384 on the H200, hd128 22.9 us (4 warps 36.6, 16 warps 25.4), hd256 40.0
    # (4 warps 633: a 128 x 256 tile at 4 warps spills; 16 warps 42.2); PyTorch's strided copy
    # (transpose_v) 208 / 389 (benchmarks/ab/h200_ab_fp8_copy_v_2026-12-04.json)
    return _rows_launch(mod, "_fp8_copy_v", v, vt, "v", None, 0, {"PERM16": perm16}, 8, use_pdl)


def fp8_launches(mod: ModuleType, spec: KernelSpec, q8, k8, vt, qs, ks, vs, out, lse, mask: MaskArgs,
                 cfg: Fp8Config, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0,
                 gluon: bool | None = None, use_pdl: bool | None = None, q16=None, rot=None) -> list[Launch]:
    """The attention launch over fp8 tensors. Dense: q8 (B, Hq, Sq, W), k8 (B, Hkv, Sk, W), vt
    (B, Hkv, Dv, S_pad), out (B, Hq, Sq, Dv) any strides, lse (B, Hq, Sq). Packed: q8 (Tq, Hq, W),
    k8 (Tk, Hkv, W), vt (Hkv, Dv, T_pad), out (Tq, Hq, Dv), lse (Hq, Tq). Descales qs (B or docs,
    Hq, blocks), ks / vs (B or docs, Hkv, blocks), the same strides for ks and vs (a 0 block stride:
    one per head). gluon: whether the Gluon kernel may serve (cfg.consumers > 0; None: on a GPU
    only, Triton's interpreter does not run Gluon; the compile probe says True); a call it cannot
    take runs the Triton kernel's config ws_fallback(cfg). use_pdl (None: pdl(q8)): launched with
    programmatic dependent launch, waiting inside for the kernel before it (the prologue). q16 (the
    call's bf16 / fp16 q, dense) and rot (rotation(), None: no rotation): the Gluon kernel may
    quantize Q itself (ws_quant_q; q_in_kernel says whether it does, and then the prologue leaves
    Q out); the Triton kernel always reads the prologue's Q8."""
    require_valid(spec, cfg, check_fp8)
    use_pdl = pdl(q8) if use_pdl is None else use_pdl
    if ks.stride() != vs.stride():
        raise ValueError(f"k and v descales need the same strides, got {ks.stride()} and {vs.stride()}")
    packed = cu_seqlens_q is not None
    hq, bh, seqlen_q, seqlen_k, rows = call_extent(q8, k8, cu_seqlens_q, max_seqlen_q)
    blocks = -(-rows // cfg.block_m)
    qk_scale, softcap_in, softcap_out = mask.score_args()
    values = {
        "Q": q8, "K": k8, "Vt": vt, "Out": out, "Lse": lse, "QScale": qs, "KScale": ks, "VScale": vs,
        "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
        **strides4("q", q8, packed), **strides4("k", k8, packed), **_vt_strides(vt, packed),
        **strides4("o", out, packed), **lse_strides(lse, packed),
        **_scale_strides("q", qs), **_scale_strides("k", ks),
        "num_q_heads": hq, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "num_m_blocks": blocks,
        "qk_scale": qk_scale, "softcap_in": softcap_in, "softcap_out": softcap_out,
        "diag_offset": 0 if packed else mask.diag_offset(seqlen_q, seqlen_k),
        "window_left": mask.window_left, "window_right": mask.window_right,
        "ALIGN_TOP_LEFT": mask.align_top_left, "OFFS_64": needs_int64(q8, k8, vt, out, lse),
        "GQA": spec.gqa_ratio, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
        "IMPRECISE_QK": 32 if cfg.precise_acc else context(spec)["fp8_qk_tiles"][0]["width"],
        "IMPRECISE_PV": 32 if cfg.precise_acc else cfg.block_n, "PDL": use_pdl,
    }
    if cfg.consumers:
        ws = ws_fp8_launch(mod, spec, q8, k8, vt, out, values, cfg, packed, gluon, q16, rot)
        if ws is not None:
            grid, ws_values, descs = ws
            return [Launch.of(mod, "_attn_fwd_fp8_ws", grid, ws_values, cfg.num_warps, 1, descs,
                              maxnreg=ws_fp8_maxnreg(spec, cfg), pdl=use_pdl)]
        cfg = ws_fallback(spec, cfg, "cpu" if q8.device.type == "cpu" else "cuda")
        require_valid(spec, cfg, check_fp8)
        blocks = -(-rows // cfg.block_m)
        values.update(num_m_blocks=blocks, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
    grid = programs(blocks, bh, "q") if rows and bh else 0
    return [Launch.of(mod, "_attn_fwd_fp8", grid, values, cfg.num_warps, cfg.num_stages, pdl=use_pdl)]


ALLOC_ALIGN = 128  # bytes between buffers of one allocation (TMA wants 16-byte aligned bases)
ELEMENT_BYTES = {"fp8": 1, "fp32": 4}  # buffers()' kinds


def alloc_layout(shapes: dict) -> tuple:
    """buffers()' shapes as views of one allocation: (bytes, any fp32 view, ((name, kind, shape,
    strides, offset), ...)), each view contiguous, its base ALLOC_ALIGN-aligned, its offset counted
    in elements of its kind. A plan keeps it, so a call pays one allocation instead of six."""
    end, views = 0, []
    for name, (shape, kind) in shapes.items():
        size = ELEMENT_BYTES[kind]
        start = -(-end // ALLOC_ALIGN) * ALLOC_ALIGN
        strides, n = [], 1
        for dim in reversed(shape):
            strides.insert(0, n)
            n *= dim
        views.append((name, kind, tuple(shape), tuple(strides), start // size))
        end = start + n * size
    return max(-(-end // ALLOC_ALIGN), 1) * ALLOC_ALIGN, any(v[1] == "fp32" for v in views), tuple(views)


def carve(layout: tuple, device) -> dict:
    """alloc_layout()'s views on fresh memory: {name: tensor}. One e4m3 allocation, the fp32
    views through its fp32 reinterpretation (its size is a multiple of ALLOC_ALIGN bytes); a
    layout of one e4m3 buffer (V^T of e4m3 inputs) is that buffer's own allocation."""
    import torch

    nbytes, fp32, views = layout
    if len(views) == 1 and not fp32:
        name, _, shape, _, _ = views[0]
        return {name: torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)}
    flat = torch.empty(nbytes, dtype=torch.float8_e4m3fn, device=device)
    wide = flat.view(torch.float32) if fp32 else None
    return {name: (flat if kind == "fp8" else wide).as_strided(shape, strides, off)
            for name, kind, shape, strides, off in views}


def addresses(layout: tuple, base: int) -> dict:
    """carve()'s buffers as device addresses inside an allocation of layout[0] bytes at `base`
    (what a raw launch takes in place of the views)."""
    return {name: base + off * ELEMENT_BYTES[kind] for name, kind, _, _, off in layout[2]}


def alloc(shapes: dict, device) -> dict:
    """buffers()' shapes -> empty tensors (e4m3 or fp32) on `device`, one allocation."""
    return carve(alloc_layout(shapes), device)


FAMILY = Family(
    "fwd_fp8", "attn_fwd_fp8.py.jinja", Fp8Config, check_fp8,
    lambda spec, kind, seqlen_q=0, window=None: default_fp8_config(spec, kind, seqlen_q),
    ("_attn_fwd_fp8", "_attn_fwd_fp8_ws"),
    "attngen.families.fwd_fp8:fp8_launches", 1.0, ("out", "lse"), space=SPACE,
    portable=lambda cfg, spec: portable_fp8(cfg, spec), variants=variants,
    hooks="attngen.families.fwd_fp8_tuning:TuningHooks", context=context)


# ------------------------------------------------------------------------------------------------
# the warp-specialized Gluon kernel's launch (its configs: attngen.families.fwd_fp8_config)


def _fp8_gluon_layout(block: tuple, dtype):
    """The NVMMA shared-memory layout of a (block, torch dtype) tile: e4m3 or the output's dtype."""
    import torch
    from triton.experimental.gluon import language as gl

    kinds = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
    return gl.NVMMASharedLayout.get_default_for(list(block), kinds[dtype])


def ws_fp8_descriptors(cfg: Fp8Config, q8, k8, vt, out, q16=None, rot=None) -> dict | None:
    """The Gluon kernel's descriptors (tensor name, shape, strides, block, shared layout), or None
    when a tensor cannot go through the copy engine: Q8 and O in blocks of one consumer's rows, K8
    in blocks of block_n keys, V^T in blocks of (Dv, block_n); desc_r: the rotation's (qk_width)^2
    matrix in blocks of ROT_TILE^2. With q16 (Q quantized inside) desc_q is the 16-bit q in
    column tiles of ROT_TILE (qk_width when narrower; columns past q's head dim read as zeros).
    desc_r is desc_q again where the kernel reads no rotation."""
    rows = cfg.block_m // cfg.consumers
    w = k8.shape[3]
    qsrc = ("Q", q8) if q16 is None else ("q", q16)
    views = {"desc_q": qsrc, "desc_k": ("K", k8), "desc_v": ("Vt", vt), "desc_o": ("Out", out)}
    blocks = {"desc_q": [1, 1, rows, q8.shape[3] if q16 is None else min(w, ROT_TILE)],
              "desc_k": [1, 1, cfg.block_n, w], "desc_v": [1, 1, vt.shape[2], cfg.block_n],
              "desc_o": [1, 1, rows, out.shape[3]]}
    if q16 is not None and rot is not None:
        views["desc_r"] = ("Rot", rot[None, None])
        blocks["desc_r"] = [1, 1, min(w, ROT_TILE), min(w, ROT_TILE)]
    descs = tma_descriptors(views, blocks)
    if descs is None:
        return None
    dtypes = {n: t.dtype for n, (_, t) in views.items()}
    descs.setdefault("desc_r", descs["desc_q"])
    dtypes.setdefault("desc_r", dtypes["desc_q"])
    return {n: (*d, _fp8_gluon_layout(tuple(d[3]), dtypes[n])) for n, d in descs.items()}


def ws_quant_q(spec: KernelSpec, cfg: Fp8Config, q16, out, rot) -> bool:
    """Whether the Gluon kernel quantizes Q itself (QUANT_Q) for a call with 16-bit q: Q's tiles
    pass through O's buffer (same dtype, Dv at least the qk width), and the rotation's blocks fit
    in shared memory beside the ring. The prologue then quantizes only K and V (a third less
    work, and Q's quantization overlaps the prologue under programmatic dependent launch)."""
    return (q16 is not None and q16.dtype == out.dtype and q16.element_size() == 2
            and spec.head_dim_v >= qk_width(spec)
            and ws_smem_bytes(spec, cfg, rot is not None) <= SMEM_LIMIT[spec.target])


def q_in_kernel(launches: list[Launch]) -> bool:
    """Whether the attention launches quantize Q themselves (the prologue leaves Q out)."""
    return any(la.values.get("QUANT_Q") for la in launches)


def ws_fp8_launch(mod: ModuleType, spec: KernelSpec, q8, k8, vt, out, values: dict, cfg: Fp8Config,
                  packed: bool, gluon: bool | None, q16=None, rot=None) -> tuple[int, dict, dict] | None:
    """The Gluon kernel's (grid, values, descriptors) for a call (`values`: the Triton kernel's, by
    name; fp8_launches makes the launch), or None when it cannot take the call (packed documents,
    no GPU unless `gluon`, tensors the copy engine cannot address, an empty call) and the Triton
    kernel serves. q16 / rot: Q quantized inside where ws_quant_q allows (QUANT_Q, ROTATE)."""
    use = (not packed and has_entry(mod, "_attn_fwd_fp8_ws")
           and (q8.device.type == "cuda" if gluon is None else gluon))
    if not use:
        return None
    B, hq, seqlen_q, _ = q8.shape
    if not (seqlen_q and B * hq):
        return None
    quant_q = ws_quant_q(spec, cfg, q16, out, rot)
    descs = ws_fp8_descriptors(cfg, q8, k8, vt, out, q16, rot) if quant_q else None
    if descs is None:  # Q8 from the prologue
        quant_q = False
        descs = ws_fp8_descriptors(cfg, q8, k8, vt, out)
    if descs is None:
        return None
    blocks = -(-seqlen_q // cfg.block_m)
    from attngen.families.fwd import WS_CONSUMER_REGS

    values = {**values, "num_m_blocks": blocks, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
              "KV_STAGES": cfg.num_stages, "CONSUMER_REGS": WS_CONSUMER_REGS, "CONSUMERS": cfg.consumers,
              "LPT": lpt_order(spec, k8), "QUANT_Q": quant_q, "ROTATE": quant_q and rot is not None}
    if quant_q:  # the descriptors' tensors (a call passes its own under these names)
        values.update(q=q16, Rot=rot)
    return programs(blocks, B * hq, "q"), values, descs


LPT_L2_SHARE = 0.8  # K / V (e4m3) of a call up to this share of the L2 cache: causal tiles in LPT order


def lpt_order(spec: KernelSpec, k8) -> bool:
    """Whether the Gluon kernel walks causal tiles in longest-processing-time order (every (batch,
    head)'s heaviest tile first, then every next one) instead of one (batch, head)'s tiles side by
    side: when the call's e4m3 K and V^T fit in L2, so that nothing is lost by spreading a head's
    tiles over the grid. H200 (50 MB L2), attention kernel alone, B1 H16, TFLOP/s, side by side
    (benchmarks/ab/h200_ab_fp8_lpt_2026-12-04.json): causal hd128 S4k (17 MB) 597 -> 671, S8k
    (34 MB) 720 -> 744 one consumer, 707 -> 754 two; hd256 S4k (34 MB) 729 -> 858; past L2 it
    loses: S16k hd128 (67 MB) 803 -> 786, hd256 (134 MB) 949 -> 912."""
    if spec.mask != "causal" or k8.device.type != "cuda":
        return False
    kv_bytes = 2 * k8.shape[0] * k8.shape[1] * k8.shape[2] * k8.shape[3]  # K8 and V^T, one byte a value
    return kv_bytes <= LPT_L2_SHARE * _l2_bytes(k8.device.index or 0)


@functools.lru_cache(maxsize=None)
def _l2_bytes(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).L2_cache_size
