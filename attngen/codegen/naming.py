"""Names and stamps of generated modules. No jinja2 here: the runtime uses it too."""

from __future__ import annotations

import hashlib

FAMILY_TEMPLATES = {"fwd": "attn_fwd.py.jinja", "bwd": "attn_bwd.py.jinja"}
HASH_LEN = 10


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def short_hash(text: str | bytes) -> str:
    return sha256(text)[:HASH_LEN]


def module_filename(uri: str, source: str) -> str:
    """`<uri>_<hash of the content>.py`."""
    return f"{uri}_{short_hash(source)}.py"
