"""Launchers: tensors + a loaded generated module + a config -> kernel launches."""
