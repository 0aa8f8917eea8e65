"""attngen: attention kernels generated from a spec language, tuned per GPU.

The public functions load on first use (PEP 562), so that `import attngen` -- and the `attngen`
command's usage and `--version` -- import neither torch nor triton. Loading them registers the
attngen:: torch ops. On a machine with no GPU, Triton's interpreter is turned on before triton is
first imported (attngen.env.setup_interpreter)."""

from __future__ import annotations

import importlib

from attngen._version import __version__

_PUBLIC = {
    "attention": "attngen.runtime.public",
    "attention_fp8": "attngen.runtime.public",
    "attention_varlen": "attngen.runtime.public",
    "attention_with_kvcache": "attngen.runtime.public",
    "check_kvcache": "attngen.runtime.kvguard",
    "explain": "attngen.runtime.tools",
    "load_pack": "attngen.runtime.packs",
    "load_variants": "attngen.runtime.variants",
    "warmup": "attngen.runtime.tools",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'attngen' has no attribute {name!r}")
    from attngen import env

    env.setup_interpreter()
    importlib.import_module("attngen.runtime.ops")  # registers the attngen:: torch ops
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
