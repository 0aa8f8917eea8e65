"""Test setup. Importing attngen first turns on Triton's interpreter on machines without a GPU;
bf16 dots and tensor-descriptor reduces in the interpreter need attngen.interp's documented patch
(applied here, and by the runtime and the tuner whenever they run a kernel through the
interpreter)."""

import attngen  # noqa: F401  (must come before anything imports triton)
from attngen import env

if env.interpreting():
    from attngen.interp import patch_interpreter

    patch_interpreter()
