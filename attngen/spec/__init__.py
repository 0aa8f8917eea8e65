"""The attngen spec language: YAML files in ``specs/`` -> validated, frozen spec objects.

Two levels:

* :class:`SpecEntry` is one ``kernels:`` entry of a YAML file, as the user wrote it (model-level
  defaults such as the window width, softcap value and softmax scale live here).
* :class:`KernelSpec` is one concrete kernel: an entry expanded over dtype x target x family. It holds
  only what changes the *structure* of the generated code; it is the one object that travels through
  codegen, tuning, the database and the runtime. Values that only change numbers (window width,
  softcap value, scale, sequence lengths, causal alignment) are launch-time arguments.

This package validates and nothing else: no Jinja, no Triton. model.py holds the vocabulary and the
frozen objects, loading.py the YAML loading and its error messages.
"""

from attngen.spec.loading import (DEFAULT_FAMILIES, load_spec, load_specs, parse_spec, spec_files,
                                  spec_label)
from attngen.spec.model import (ALIGNMENTS, DTYPES, FAMILIES, IMPLEMENTED_DTYPES, INNER_MASKS, MASKS,
                                MAX_HEAD_DIM, MIN_HEAD_DIM, TARGETS, KernelSpec, SpecEntry, SpecError,
                                SpecFile, head_chunks)

__all__ = ["ALIGNMENTS", "DEFAULT_FAMILIES", "DTYPES", "FAMILIES", "IMPLEMENTED_DTYPES", "INNER_MASKS",
           "MASKS", "MAX_HEAD_DIM", "MIN_HEAD_DIM", "TARGETS", "KernelSpec", "SpecEntry", "SpecError",
           "SpecFile", "head_chunks", "load_spec", "load_specs", "parse_spec", "spec_files", "spec_label"]
