"""spec -> Triton source. Only this package imports jinja2."""
