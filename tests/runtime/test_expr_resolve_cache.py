"""The host path of a call with expressions: resolve() parses a traced text once (cached on the
text and the parameters' declarations), and still sees every change a closure makes."""
import torch

from attngen.runtime import exprs, validate
from attngen.spec import expr as X


def _opts():
    return validate.make_options(64, False, (-1, -1), 0.0, None, "bottom_right", "bhsd")


def test_second_call_parses_nothing(monkeypatch):
    q = torch.randn(1, 4, 8, 64)
    doc = torch.arange(97, dtype=torch.int32) // 13  # a size no other test uses: a cold cache entry
    mm = lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi)  # noqa: E731
    first = exprs.expr_options(q, 4, _opts(), mm, None, None, None)
    calls = []
    real = X.parse
    monkeypatch.setattr(X, "parse", lambda *a, **k: calls.append(a) or real(*a, **k))
    second = exprs.expr_options(q, 4, _opts(), mm, None, None, None)
    assert calls == []
    assert second[0] == first[0]
    assert second[1]["XP_mp0"].data_ptr() == doc.data_ptr()


def test_closure_changes_are_seen():
    q = torch.randn(1, 4, 8, 64)
    window = 37
    mm = lambda b, h, qi, ki: (ki <= qi) & (qi - ki < window) & (qi % 3 != ki % 5)  # noqa: E731
    a = exprs.expr_options(q, 4, _opts(), mm, None, None, None)[0].expr.mask_expr
    window = 41
    b = exprs.expr_options(q, 4, _opts(), mm, None, None, None)[0].expr.mask_expr
    assert "37" in a and "41" in b and "37" not in b
    # a captured tensor replaced by one of another shape: new declarations, the new tensor passed
    bias = torch.randn(4, 8)
    sm = lambda s, b, h, qi, ki: s + bias[h, ki % 8]  # noqa: E731
    x1, e1, _ = exprs.expr_options(q, 4, _opts(), None, sm, None, None)
    bias = torch.randn(4, 16)
    sm = lambda s, b, h, qi, ki: s + bias[h, ki % 16]  # noqa: E731
    x2, e2, _ = exprs.expr_options(q, 4, _opts(), None, sm, None, None)
    assert e2["XP_sp0"].data_ptr() == bias.data_ptr() != e1["XP_sp0"].data_ptr()
    assert [d.shape for d in x1.expr.params] != [d.shape for d in x2.expr.params]


def test_errors_are_not_cached():
    q = torch.randn(1, 4, 8, 64)
    slope = torch.randn(4, requires_grad=True)
    mm = lambda b, h, qi, ki: qi * slope[h] >= ki  # noqa: E731
    for _ in range(2):  # a learnable parameter in the mask: refused every time
        try:
            exprs.expr_options(q, 4, _opts(), mm, None, None, None)
        except ValueError as e:
            assert "requires grad but is used in the mask" in str(e)
        else:
            raise AssertionError("no error")
    # the same text with the parameter not learnable is fine
    x, _, learn = exprs.expr_options(q, 4, _opts(), mm, None, None, None, learnable=())
    assert learn == [] and x.expr.mask_expr


def test_runs_kept_while_the_ids_are_unchanged():
    """XR_<P> of a document-id tensor is computed once per tensor and version: every in-place write
    (to it or to its base) recomputes it, and another tensor of equal content gets its own."""
    from attngen.kernels.expr_buffers import run_bounds

    q = torch.randn(1, 4, 8, 64)
    base = torch.cat([torch.arange(131, dtype=torch.int32) // 17, torch.zeros(5, dtype=torch.int32)])
    doc = base[:131]  # a view: writes through the base bump its version too

    def xr():
        mm = lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi)  # noqa: E731
        return exprs.expr_options(q, 4, _opts(), mm, None, None, None)[1]["XR_mp0"]

    first = xr()
    assert torch.equal(first, run_bounds(doc)) and xr() is first
    doc[40:60] = 3  # in place: the runs change
    second = xr()
    assert second is not first and torch.equal(second, run_bounds(doc))
    base[0] = 7  # through the base: P now decreases at 1, so the runs bound nothing
    third = xr()
    assert third is not second and torch.equal(third, run_bounds(doc)) and int(third[-1]) == 0
    doc = doc.clone()  # equal content, another tensor
    assert xr() is not third and torch.equal(xr(), third)
    n = len(exprs._RUNS)
    del doc, base
    import gc

    gc.collect()
    assert len(exprs._RUNS) < n  # a dead tensor's entry goes with it
