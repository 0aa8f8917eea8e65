"""attngen: attention kernels generated from a spec language, tuned per GPU."""

from attngen import env as _env

_env.setup_interpreter()  # before anything imports triton

from attngen._version import __version__  # noqa: E402
from attngen.runtime.public import (attention, attention_fp8, attention_varlen,  # noqa: E402
                                    attention_with_kvcache)
from attngen.runtime import ops as _ops  # noqa: E402,F401  (registers the attngen:: torch ops)
from attngen.runtime.tools import explain, warmup  # noqa: E402

__all__ = ["__version__", "attention", "attention_fp8", "attention_varlen", "attention_with_kvcache", "explain", "warmup"]
