"""Adapters that plug attngen into other libraries (imported on demand only)."""
