"""Names and stamps of generated modules. No jinja2 here: the runtime uses it too."""

from __future__ import annotations

from attngen.codegen.hashing import KERNEL_HASH_LEN, kernel_hash, sha256  # noqa: F401 (re-exported)
from attngen.families import FAMILIES

FAMILY_TEMPLATES = {name: f.template for name, f in FAMILIES.items()}
HASH_LEN = 10


def short_hash(text: str | bytes) -> str:
    return sha256(text)[:HASH_LEN]


def module_filename(uri: str, source: str) -> str:
    """`<uri>_<hash of the content>.py`."""
    return f"{uri}_{short_hash(source)}.py"


def source_stamp(label: str, entry: str, spec_sha256: str) -> str:
    """How a generated header and the manifest name one spec entry that asked for a kernel:
    "specs/llama.yaml#llama3_8b (sha256 <first 16 hex digits of the spec file's sha256>)"."""
    return f"{label}#{entry} (sha256 {spec_sha256[:16]})"


def source_label(stamp: str) -> str:
    """The spec file part ("specs/llama.yaml") of a source_stamp (entry names never hold a '#')."""
    return stamp.rsplit("#", 1)[0]
