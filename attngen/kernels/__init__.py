"""Launchers: tensors + a loaded generated module + a config -> kernel launches."""

from attngen import env as _env

_env.setup_interpreter()  # before launch.py imports triton

