"""Providers: one table (PROVIDERS) of what `attngen bench` measures, each a function that binds
the provider to a case's inputs or raises Unsupported(reason). All run in one process on the same
tensors; ratios are attngen / peer, and attngen-sm80 / each non-attngen peer.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from attngen.bench.cases import Case


class Unsupported(Exception):
    """A provider cannot run a case; the message is recorded in place of a number."""


@dataclass
class Inputs:
    """One case's tensors, shared by every provider: dense (B, H, S, D), contiguous."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cu_seqlens: torch.Tensor  # int32 document offsets within the packed (B * S) tokens


@dataclass
class Prepared:
    """A provider bound to one case: `forward()` runs it on `leaves` and returns out."""

    forward: Callable[[], torch.Tensor]
    leaves: tuple[torch.Tensor, ...]  # (q, k, v) in the provider's layout
    dout: torch.Tensor  # in the provider's layout
    # (out, [dq, dk, dv]) in the provider's layout -> dense (B, H, S, D) for the checks
    to_dense: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] = lambda ts: ts
    context: Callable[[], ContextManager] = contextlib.nullcontext
    note: str | None = None


@dataclass(frozen=True)
class Provider:
    name: str  # JSON key
    label: str  # what it is, for the JSON header and README
    prepare: Callable[[Case, Inputs, str], Prepared]  # raises Unsupported(reason)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _need_grad(out: torch.Tensor, what: str) -> None:
    if not out.requires_grad:
        raise Unsupported(f"not available: {what} is not differentiable yet (no autograd)")


def _pack(t: torch.Tensor) -> torch.Tensor:
    """(B, H, S, D) -> packed (B * S, H, D)."""
    B, H, S, D = t.shape
    return t.detach().transpose(1, 2).reshape(B * S, H, D).contiguous()


def _unpack(t: torch.Tensor, batch: int) -> torch.Tensor:
    T, H, D = t.shape
    return t.reshape(batch, T // batch, H, D).transpose(1, 2)


def _prepare_attngen(case: Case, x: Inputs, mode: str) -> Prepared:
    import attngen

    grad = mode == "fwdbwd"
    if case.docs:
        varlen = getattr(attngen, "attention_varlen", None)
        if varlen is None:
            raise Unsupported("not available: attngen.attention_varlen is missing")
        q, k, v = (_pack(t).requires_grad_(grad) for t in (x.q, x.k, x.v))
        cu, max_len = x.cu_seqlens, max(case.doc_lens)
        kw = {"causal": case.causal}
        if case.window > 0:
            kw["window_size"] = case.window_size

        def forward():
            return _first(varlen(q, k, v, cu, cu, max_len, max_len, **kw))

        prepared = Prepared(forward, (q, k, v), _pack(x.dout),
                            to_dense=lambda ts: tuple(_unpack(t, case.batch) for t in ts))
    else:

        def forward():
            return attngen.attention(x.q, x.k, x.v, causal=case.causal,
                                     window_size=case.window_size)

        prepared = Prepared(forward, (x.q, x.k, x.v), x.dout)
    if grad:
        _need_grad(prepared.forward(),
                   "attngen.attention_varlen" if case.docs else "attngen.attention")
    return prepared


def _prepare_attngen_sm80(case: Case, x: Inputs, mode: str) -> Prepared:
    """attngen with the sm80 family (FlashAttention-2 style pointer kernels) forced: beside
    `attngen` (the sm90 family on Hopper) on the same GPU. Plans are cached per forced target."""
    from attngen.runtime import dispatch

    if dispatch.native_target(x.q.device) == "sm80":
        raise Unsupported("skipped: same kernels as attngen on this GPU (the sm80 family is its own)")

    def context():
        return dispatch.forced_target("sm80")

    with context():  # the gradient probe builds its plan under the forced target too
        prepared = _prepare_attngen(case, x, mode)
    prepared.context = context
    return prepared


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sdpa_refusal(call: Callable[[], object], context: Callable[[], ContextManager],
                  device: torch.device) -> str | None:
    """Run `call` once under `context`; None if it ran, else why the backend refused it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context():
                call()
            sync(device)
            return None
        except RuntimeError as exc:
            why = [str(w.message).strip() for w in caught if "because" in str(w.message)]
            return "refused: " + ("; ".join(why) or str(exc).strip().splitlines()[0])[:400]


def _sdpa_provider(backend: str) -> Callable[[Case, Inputs, str], Prepared]:
    def prepare(case: Case, x: Inputs, mode: str) -> Prepared:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if case.docs:
            raise Unsupported("skipped: SDPA has no document (varlen) mask")
        if case.window > 0:
            raise Unsupported("skipped: sliding window is not expressible in SDPA (no window "
                              "argument; a dense attn_mask leaves the fused kernels)")
        chosen = getattr(SDPBackend, backend)

        def context():
            return sdpa_kernel([chosen])

        def bind(k, v, gqa) -> Prepared:
            def forward():
                return F.scaled_dot_product_attention(x.q, k, v, is_causal=case.causal,
                                                      enable_gqa=gqa)

            return Prepared(forward, (x.q, k, v), x.dout, context=context)

        def refusal(p: Prepared) -> str | None:
            if mode == "fwd":
                with torch.no_grad():
                    return _sdpa_refusal(p.forward, context, x.q.device)
            return _sdpa_refusal(lambda: torch.autograd.grad(p.forward(), p.leaves, p.dout),
                                 context, x.q.device)

        gqa = case.heads_q != case.heads_kv
        prepared = bind(x.k, x.v, gqa)
        why = refusal(prepared)
        if why is None:
            return prepared
        if not gqa:
            raise Unsupported(why)
        # The backend refused enable_gqa: give it K/V expanded to Hq heads (outside the timed step;
        # dK/dV are summed back over each group for the check).
        g = case.heads_q // case.heads_kv
        k, v = (t.detach().repeat_interleave(g, dim=1).requires_grad_(mode == "fwdbwd")
                for t in (x.k, x.v))
        expanded = bind(k, v, False)
        if refusal(expanded) is not None:
            raise Unsupported(why)

        def to_dense(ts):
            if len(ts) == 1:
                return ts
            out, dq, dk, dv = ts
            fold = [t.unflatten(1, (case.heads_kv, g)).sum(2) for t in (dk, dv)]
            return (out, dq, *fold)

        expanded.to_dense = to_dense
        expanded.note = f"enable_gqa {why}; ran with K/V expanded to {case.heads_q} heads"
        return expanded

    return prepare


def configure_dynamo() -> None:
    """Never let a compiled FlexAttention silently fall back to eager (the failure in the first
    anchors file): a high recompile limit, and an error instead of a fallback when it is hit."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(int(getattr(cfg, name)), 64))
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, name):
            setattr(cfg, name, True)


def _flex_mask_mod(case: Case, x: Inputs):
    """The case's mask as a FlexAttention mask_mod (None for a full mask). A window of w keys is
    causal (window_size = (w - 1, 0)); document ids keep each query inside its own document."""
    if not (case.causal or case.window > 0 or case.docs):
        return None
    doc = None
    if case.docs:
        lens = torch.tensor(case.doc_lens, device=x.q.device)
        doc = torch.repeat_interleave(torch.arange(case.docs, device=x.q.device), lens)
    causal, w = case.causal or case.window > 0, case.window

    def mask_mod(b, h, q_idx, kv_idx):
        keep = q_idx >= kv_idx if causal else None
        if w > 0:
            keep = keep & (q_idx - kv_idx < w)
        if doc is not None:
            same = doc[q_idx] == doc[kv_idx]
            keep = same if keep is None else keep & same
        return keep

    return mask_mod


def _prepare_flex(case: Case, x: Inputs, mode: str) -> Prepared:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.reset()  # a fresh compile per case and mode: no recompile limit to hit
    configure_dynamo()
    mask_mod = _flex_mask_mod(case, x)
    block_mask = None
    if mask_mod is not None:
        block_mask = create_block_mask(mask_mod, None, None, case.seqlen, case.seqlen,
                                       device=x.q.device)
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = case.heads_q != case.heads_kv

    def forward():
        return compiled(x.q, x.k, x.v, block_mask=block_mask, enable_gqa=gqa)

    return Prepared(forward, (x.q, x.k, x.v), x.dout)


PROVIDERS: tuple[Provider, ...] = (
    Provider("attngen", "attngen generated Triton kernels (the GPU's own family: sm90 on Hopper)",
             _prepare_attngen),
    Provider("attngen-sm80", "attngen under dispatch.forced_target('sm80'): the sm80-family "
             "(FlashAttention-2 style pointer) kernels, on an sm90 GPU only", _prepare_attngen_sm80),
    Provider("cudnn", "SDPA, CUDNN_ATTENTION backend", _sdpa_provider("CUDNN_ATTENTION")),
    Provider("fa2", "SDPA, FLASH_ATTENTION backend (FlashAttention-2)",
             _sdpa_provider("FLASH_ATTENTION")),
    Provider("flex", "torch.compile(flex_attention) with block masks", _prepare_flex),
)
PROVIDERS_BY_NAME = {p.name: p for p in PROVIDERS}
REFERENCE = "attngen"  # ratios are attngen / peer; checks compare against attngen's output


def is_attngen(name: str) -> bool:
    """attngen itself or one of its variants (attngen-sm80): the numerators of the ratios."""
    return name == REFERENCE or name.startswith(REFERENCE + "-")
