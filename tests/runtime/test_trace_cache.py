"""Kept traces (attngen/runtime/trace.py: _trace, _fingerprint): a callable is traced once while
everything it can read stays the same, and traced again when any of it changes -- a closure's
number or tensor, a global, a tensor written in place, a helper function's own closure."""
import gc
import weakref

import pytest
import torch

from attngen.runtime import trace

WINDOW = 100  # read as a global by _global_window


def _global_window(b, h, q, k):
    return (k <= q) & (q - k < WINDOW)


@pytest.fixture
def count(monkeypatch):
    calls = []
    real = trace._trace_now
    monkeypatch.setattr(trace, "_trace_now", lambda *a: calls.append(a[1]) or real(*a))
    return calls


def test_a_callable_is_traced_once(count):
    doc = torch.arange(131, dtype=torch.int32) // 7
    mm = lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q)  # noqa: E731
    a = trace.trace_mask_mod(mm)
    b = trace.trace_mask_mod(mm)
    assert len(count) == 1
    assert a.expr == b.expr and b.params[0][1] is doc
    # the same code over another closure (a new lambda each call, as a model's forward makes one)
    mm2 = lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q)  # noqa: E731
    trace.trace_mask_mod(mm2)
    assert len(count) == 2  # another code object
    makers = [(lambda d: (lambda b, h, q, k: d[q] == d[k]))(doc) for _ in range(3)]
    for m in makers:
        assert trace.trace_mask_mod(m).params[0][1] is doc
    assert len(count) == 3


def test_every_change_is_seen(count, monkeypatch):
    window = 37
    mm = lambda b, h, q, k: (k <= q) & (q - k < window)  # noqa: E731
    assert "37" in trace.trace_mask_mod(mm).expr
    window = 41
    assert "41" in trace.trace_mask_mod(mm).expr
    # a global
    assert "100" in trace.trace_mask_mod(_global_window).expr
    monkeypatch.setitem(_global_window.__globals__, "WINDOW", 200)
    assert "200" in trace.trace_mask_mod(_global_window).expr
    # a value read from a tensor, then the tensor written in place
    w = torch.tensor(5)
    mm3 = lambda b, h, q, k: q - k < int(w.item())  # noqa: E731
    assert "5" in trace.trace_mask_mod(mm3).expr
    w.fill_(9)
    assert "9" in trace.trace_mask_mod(mm3).expr
    # a helper function's closure
    scale = 2

    def helper(x):
        return x * scale

    sm = lambda s, b, h, q, k: s + helper(q - k)  # noqa: E731
    assert "2" in trace.trace_score_mod(sm).expr
    scale = 3
    assert "3" in trace.trace_score_mod(sm).expr
    # a tensor replaced by another of the same shape: the new one is the parameter
    bias = torch.randn(4)
    sm2 = lambda s, b, h, q, k: s + bias[h]  # noqa: E731
    assert trace.trace_score_mod(sm2).params[0][1] is bias
    bias = torch.randn(4)
    assert trace.trace_score_mod(sm2).params[0][1] is bias
    assert len(count) == 10


def test_kept_traces_hold_no_tensor():
    t = torch.randn(8)
    sm = lambda s, b, h, q, k: s + t[h]  # noqa: E731
    trace.trace_score_mod(sm)
    ref = weakref.ref(t)
    del sm, t
    gc.collect()
    assert ref() is None


def test_what_cannot_be_keyed_is_traced_every_call(count):
    cfg = {"window": 64}
    mm = lambda b, h, q, k: q - k < cfg["window"]  # noqa: E731
    trace.trace_mask_mod(mm)
    cfg["window"] = 65
    assert "65" in trace.trace_mask_mod(mm).expr

    class Mod:
        window = 7

        def mask(self, b, h, q, k):
            return q - k < self.window

    m = Mod()
    trace.trace_mask_mod(m.mask)
    m.window = 8
    assert "8" in trace.trace_mask_mod(m.mask).expr
    assert len(count) == 4


def test_errors_are_not_kept(count):
    big = torch.randn(4, 4)
    mm = lambda b, h, q, k: big > 0  # noqa: E731
    for _ in range(2):
        with pytest.raises(trace.TraceError, match="used as a value"):
            trace.trace_mask_mod(mm)
    assert len(count) == 2


def test_an_unbound_cell_is_traced_not_keyed(count):
    def make():
        def mm(b, h, q, k):
            return k <= q if late is None else k <= q  # noqa: F821 -- `late` is bound below, after the trace
        return mm
        late = None  # noqa: F841 -- never reached: the cell stays empty

    mm = make()
    with pytest.raises(NameError):  # the callable's own error, not the fingerprint's on the empty cell
        trace.trace_mask_mod(mm)
    assert len(count) == 1
