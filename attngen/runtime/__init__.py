"""Runtime: pick a generated kernel for a call, load it, launch it. Never imports jinja2 or optuna
unless a kernel has to be rendered on demand."""

from attngen import env as _env

_env.setup_interpreter()  # before plans.py imports triton
