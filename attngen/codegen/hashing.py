"""The content hashes of generated modules, in the standard library only (no torch, no attngen
imports), so that another Python can load this file alone and check that a hash does not depend on
the Python version (tests/codegen/test_kernel_hash.py)."""

from __future__ import annotations

import functools
import hashlib

KERNEL_HASH_LEN = 16


def sha256(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def templates_hash(root, names) -> str:
    """The template hash a generated module's stamp carries: of the files `names` (the family
    template first, then its partials sorted) under the folder `root`, names and contents. The
    build (codegen/render.py) and the runtime's check of a built module (runtime/loader.py) both
    take it from here."""
    import os

    return sha256("\n".join(f"{n}\n{open(os.path.join(str(root), n)).read()}" for n in names))[:16]


# token types by name, numbered as Python 3.11 numbers them: the numbers differ between Python
# versions (OP is 54 in 3.11, 55 in 3.12), and a hash of them keyed winners tuned under one Python
# to that Python only
_TOKEN_IDS = {"NAME": 1, "NUMBER": 2, "STRING": 3, "NEWLINE": 4, "INDENT": 5, "DEDENT": 6, "OP": 54}


def _tokens(source: str):
    """(type, text, line) of the module's tokens as Python 3.11 gives them: from 3.12 on an f-string
    comes as FSTRING_START ... FSTRING_END with its parts in between; it goes back to one STRING
    token of its source text."""
    import io
    import tokenize

    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(pos):
        return starts[pos[0] - 1] + pos[1]

    skip = ("COMMENT", "NL", "ENCODING", "ENDMARKER")
    depth, first = 0, None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        name = tokenize.tok_name[tok.type]
        if name == "FSTRING_START":
            depth += 1
            first = first or tok
            continue
        if depth:
            if name == "FSTRING_END":
                depth -= 1
                if not depth:
                    yield _TOKEN_IDS["STRING"], source[offset(first.start):offset(tok.end)], first.line
                    first = None
            continue
        if name not in skip:
            yield _TOKEN_IDS.get(name, tok.type), tok.string, tok.line


@functools.lru_cache(maxsize=512)  # a pure function of the text; the tuner's plan renders every kernel per call
def kernel_hash(source: str) -> str:
    """The content hash of a generated module: of its Python tokens, without comments (the stamp
    header is comments), blank lines and line breaks inside brackets, and without its own
    KERNEL_HASH line. Tuned winners are keyed by it, so any change to the code of a module -- from
    a template, a partial it uses or Python codegen -- stales them, while a change elsewhere
    (another family's partial, a comment, a spec file's name, the attngen version, the Python
    version) does not."""
    toks = [f"{kind} {text}" for kind, text, line in _tokens(source) if not line.startswith("KERNEL_HASH = ")]
    return sha256("\n".join(toks))[:KERNEL_HASH_LEN]


def stamped_kernel_hash(source: str) -> str:
    """The KERNEL_HASH a rendered module carries (render() stamps kernel_hash of the module; the
    tests check that they agree for every generated module): read back, not tokenized again."""
    for line in source.splitlines():
        if line.startswith('KERNEL_HASH = "'):
            return line.split('"')[1]
    raise ValueError("not a generated module: no KERNEL_HASH line")
