"""Test setup: a temporary cache folder (ATTNGEN_CACHE_DIR) for the whole run; Triton's interpreter
turned on first on machines without a GPU;
bf16 dots and tensor-descriptor reduces in the interpreter need attngen.interp's documented patch
(applied here, and by the runtime and the tuner whenever they run a kernel through the
interpreter)."""

import os
import shutil
import tempfile

# The tests' own cache folder, set before attngen is imported: kernels rendered on demand, builds of
# an installed package and the user's tuning database go here, never into ~/.cache/attngen.
# (Each xdist worker imports this file: one folder per process, removed at its end.)
TEST_CACHE = tempfile.mkdtemp(prefix="attngen-test-cache-")
os.environ["ATTNGEN_CACHE_DIR"] = TEST_CACHE

import attngen  # noqa: E402,F401
from attngen import env  # noqa: E402

env.setup_interpreter()  # before anything imports triton

if env.interpreting():
    from attngen.interp import patch_interpreter

    patch_interpreter()


def pytest_unconfigure(config):
    shutil.rmtree(TEST_CACHE, ignore_errors=True)
