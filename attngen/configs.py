"""The launch configurations of every family under one name: the names of attngen.families.fwd,
attngen.families.bwd and attngen.families.base, and the search-space helpers keyed by family name.
Callers that know their family import from its module; this one serves code that works across
families (the tuner, the database, the tests)."""

from __future__ import annotations

import dataclasses

from attngen.families import FAMILIES, family as _family
from attngen.families.base import (KERNEL_KNOBS, SMEM_LIMIT, WS_MAXNREG, InvalidConfig,  # noqa: F401
                                   config_from_dict, next_pow2, require_valid)
from attngen.families import base as _base
from attngen.families.bwd import (SHORT_WINDOW, WS_BWD_CONSUMER_REGS, WS_BWD_DEFAULT,  # noqa: F401
                                  WS_BWD_DEFAULT_HD64, WS_BWD_DKDV_M64, WS_BWD_HEAD_DIMS, WS_BWD_ROLES, WS_BWD_ROLES_DQ,
                                  WS_BWD_TWO_TILE_DEFAULT, BwdConfig,
                                  bwd_smem_bytes, bwd_triton_fallback, check_bwd, check_ws_bwd,
                                  default_bwd_config, pointer_bwd_config, ws_backward)
from attngen.families.bwd import SPACE as BWD_SPACE  # noqa: F401
from attngen.families.fwd import (DOCS_MIN_LEN, EVEN_DOCS, WS_CONSUMER_REGS, WS_DEFAULT,  # noqa: F401
                                  WS_DEFAULT_WIDE, WS_DOCS, WS_HEAD_DIMS, WS_MAXNREG_ONE, FwdConfig,
                                  _sm90_fwd_default, check_fwd, check_ws, default_fwd_config,
                                  fwd_smem_bytes, persistent_docs_ok, pointer_fwd_config,
                                  split_head_dim, triton_fallback, ws_forward, ws_fwd_maxnreg)
from attngen.families.fwd import SPACE as FWD_SPACE  # noqa: F401

def search_order(family: str, target: str, names: list[str]) -> list[str]:
    return _base.search_order(_family(family), target, names)


def search_space(config_cls: type, family: str, target: str) -> dict[str, tuple]:
    return _base.search_space(dataclasses.replace(_family(family), config=config_cls), target)


def enumerate_space(config_cls: type, family: str, spec, check=None) -> list[tuple[object, str | None]]:
    fam = dataclasses.replace(_family(family), config=config_cls, check=check or _family(family).check)
    return _base.enumerate_space(fam, spec)
