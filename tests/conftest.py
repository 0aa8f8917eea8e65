"""Test setup. Importing attngen first turns on Triton's interpreter on machines without a GPU;
bf16 dots in the interpreter need attngen.interp's documented patch (applied here and by the
runtime whenever it runs a bf16 kernel through the interpreter)."""

import attngen  # noqa: F401  (must come before anything imports triton)
from attngen import env

if env.interpreting():
    from attngen.interp import patch_bf16_dot

    patch_bf16_dot()
