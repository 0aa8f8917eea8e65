"""Names and stamps of generated modules. No jinja2 here: the runtime uses it too."""

from __future__ import annotations

import hashlib

from attngen.families import FAMILIES

FAMILY_TEMPLATES = {name: f.template for name, f in FAMILIES.items()}
HASH_LEN = 10


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def short_hash(text: str | bytes) -> str:
    return sha256(text)[:HASH_LEN]


KERNEL_HASH_LEN = 16


def kernel_hash(source: str) -> str:
    """The content hash of a generated module: of its Python tokens, without comments (the stamp
    header is comments), blank lines and line breaks inside brackets, and without its own
    KERNEL_HASH line. Tuned winners are keyed by it, so any change to the code of a module -- from
    a template, a partial it uses or Python codegen -- stales them, while a change elsewhere
    (another family's partial, a comment, a spec file's name, the attngen version) does not."""
    import io
    import tokenize

    skip = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER)
    toks = [f"{tok.type} {tok.string}" for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type not in skip and not tok.line.startswith("KERNEL_HASH = ")]
    return sha256("\n".join(toks))[:KERNEL_HASH_LEN]


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
