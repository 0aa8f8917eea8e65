"""The test suite as one package (tests.kernels, tests.runtime, ...): pytest then puts the
repository root on sys.path rather than tests/, so tests/kernels does not shadow the `kernels`
distribution (Hugging Face's kernel hub, which transformers imports)."""
