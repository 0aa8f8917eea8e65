"""KV-cache metadata out of range: what attention_with_kvcache, and attention_varlen on a paged
cache, check, and where (docs/decode.md, "Metadata out of range").

The decode kernels never read or write outside the caches, whatever `cache_seqlens`,
`block_table`, `cache_batch_idx` and `cache_leftpad` hold (templates/attn_decode.py.jinja): a
row's keys are clamped to the cache's capacity, a page index outside [0, num_pages) is never
followed, a new token with no room is not written, a cache row outside the cache is never read
or written, a left pad is clamped into [0, cache_seqlens]. The paged prefill kernel
(templates/attn_prefill_paged.py.jinja) does the same with the key counts of `seqused_k` /
`cu_seqlens_k`. What the caller is told:

* metadata on the CPU (Triton's interpreter) is checked here before the launch: a ValueError
  naming the argument, the row and the value, and nothing written;
* metadata on a GPU is not copied to the host on the default path (a call stays free of syncs and
  CUDA-graph capturable): the kernels write row + 1 into a slot of this device's flag tensor
  (one int32 tensor per device, made once), and `attngen.check_kvcache()` reads it (a sync),
  clears it and raises;
* `validate=True` (or ATTNGEN_CHECK_KVCACHE=1, attngen.env.check_kvcache) checks GPU metadata
  here too, with one device-to-host copy, before the launch (not while a CUDA graph is captured,
  where the flag still records).
"""

from __future__ import annotations

import torch

from attngen.families.decode import FLAG_SLOTS as DECODE_SLOTS
from attngen.families.decode import NUM_FLAGS
from attngen.families.prefill_paged import FLAG_SLOTS as PREFILL_SLOTS

# every slot either family's kernels write (FLAG_TABLE is shared: a page index outside the pool)
FLAG_SLOTS = {**DECODE_SLOTS, **PREFILL_SLOTS}

_FLAGS: dict[torch.device, torch.Tensor] = {}

# what a flagged row means, per slot
_MEANING = {
    "FLAG_SEQLENS": "cache_seqlens: row {row} is below 0, or with the new tokens above the cache's capacity "
                    "(max_pages x page_size paged, S_max dense); the kernel clamped its keys into the cache",
    "FLAG_TABLE": "block_table: row {row} uses a page index outside [0, num_pages); that page was never read "
                  "or written (the row's output is not meaningful)",
    "FLAG_APPEND": "cache_seqlens: row {row}: new k / v past the row's capacity (or at a negative position) "
                   "were not written",
    "FLAG_BATCH_IDX": "cache_batch_idx: row {row} names a cache row outside [0, k_cache.shape[0]); no cache row "
                      "was read or written for it (its output is zeros, its lse -inf)",
    "FLAG_LEFTPAD": "cache_leftpad: row {row} is below 0 or above the row's cache_seqlens; the kernel clamped it "
                    "into [0, cache_seqlens]",
    "FLAG_KEYS": "seqused_k (or cu_seqlens_k without it): sequence {row} of attention_varlen on a paged cache has "
                 "a key count below 0 or above its block_table row's capacity (max_pages x page_size); the kernel "
                 "clamped it into the row",
}


def _device(device) -> torch.device:
    """torch.device(device), a CUDA device with its index ("cuda" -> the current one)."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def flags(device) -> torch.Tensor:
    """The device's int32 (NUM_FLAGS,) flag tensor, made once (zeros) and reused, so a CUDA graph
    that captured a call keeps writing into it."""
    f = _FLAGS.get(device)
    if f is None:
        device = _device(device)
        f = _FLAGS.get(device)
        if f is None:
            f = _FLAGS[device] = torch.zeros(NUM_FLAGS, dtype=torch.int32, device=device)
    return f


def check_kvcache(device=None) -> None:
    """Raise a ValueError naming the argument (`cache_seqlens`, `block_table`, `cache_batch_idx`,
    `cache_leftpad`, `seqused_k`) and a row if an attention_with_kvcache call, or an
    attention_varlen call on a paged cache, since the last check had metadata out of range, and
    clear the record. Reads the flag of `device` (a torch.device or str; None: every device a call ran on):
    a device-to-host copy, so call it where a sync is cheap (after a step, in a test, in debug
    builds), not inside a captured CUDA graph."""
    devices = list(_FLAGS) if device is None else [_device(device)]
    found = []
    for dev in devices:
        f = _FLAGS.get(dev)
        if f is None:
            continue
        values = f.tolist()
        if any(values):
            f.zero_()
            found += [f"{_MEANING[name].format(row=values[slot] - 1)} (on {dev})"
                      for name, slot in FLAG_SLOTS.items() if values[slot]]
    if found:
        raise ValueError("; ".join(found))


def capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_values(cache_seqlens, block_table, new_len: int, capacity: int, num_pages: int, page_size: int,
                 cache_batch_idx=None, cache_leftpad=None, cache_rows: int = 0) -> None:
    """Host check of a call's metadata values (a device-to-host copy for GPU tensors): every row's
    cache_seqlens in [0, capacity - new_len], every block-table entry of a page the row uses (its
    first ceil((cache_seqlens + new_len) / page_size)) in [0, num_pages), every cache_batch_idx in
    [0, cache_rows), every cache_leftpad in [0, cache_seqlens] (None: [0, capacity]). Entries past
    the used pages may hold anything. Raises a ValueError naming the argument, the row and the
    value."""
    if cache_seqlens is not None:
        lens = cache_seqlens.cpu().long()
        bad = ((lens < 0) | (lens > capacity - new_len)).nonzero()
        if bad.numel():
            row = int(bad[0])
            what = (f"{int(lens[row])} keys + {new_len} new" if new_len else f"{int(lens[row])} keys")
            if block_table is not None:
                room = f"{capacity} ({block_table.shape[1]} pages of {page_size} in block_table)"
            else:
                room = f"{capacity} (the cache's S_max)"
            raise ValueError(f"cache_seqlens: row {row} holds {what}; must be from 0 to a row's capacity {room}")
        bad = None if block_table is None else _bad_entry(block_table, lens + new_len, num_pages, page_size)
        if bad is not None:
            row, col, value = bad
            raise ValueError(f"block_table: row {row}, entry {col} is {value}, a page the row uses "
                             f"(cache_seqlens {int(lens[row])} + {new_len} new keys); pages are 0 to "
                             f"{num_pages - 1} (k_cache holds {num_pages})")
    if cache_batch_idx is not None:
        rows = cache_batch_idx.cpu().long()
        bad = ((rows < 0) | (rows >= cache_rows)).nonzero()
        if bad.numel():
            row = int(bad[0])
            raise ValueError(f"cache_batch_idx: row {row} is {int(rows[row])}; cache rows are 0 to {cache_rows - 1} "
                             f"(k_cache holds {cache_rows})")
    if cache_leftpad is not None:
        pads = cache_leftpad.cpu().long()
        top = lens if cache_seqlens is not None else torch.full_like(pads, capacity)
        bad = ((pads < 0) | (pads > top)).nonzero()
        if bad.numel():
            row = int(bad[0])
            raise ValueError(f"cache_leftpad: row {row} is {int(pads[row])}; must be from 0 to the row's "
                             f"{'cache_seqlens' if cache_seqlens is not None else 'S_max'} {int(top[row])}")


def _bad_entry(block_table, keys, num_pages: int, page_size: int):
    """(row, entry, value) of the first block-table entry outside [0, num_pages) among the pages
    each row uses (its first ceil(keys / page_size)), or None."""
    if not block_table.numel():
        return None
    table = block_table.cpu().long()
    used = torch.arange(table.shape[1])[None, :] < ((keys + page_size - 1) // page_size)[:, None]
    bad = (used & ((table < 0) | (table >= num_pages))).nonzero()
    if not bad.numel():
        return None
    row, col = (int(x) for x in bad[0])
    return row, col, int(table[row, col])


def check_prefill_values(seqused_k, cu_seqlens_k, block_table, num_pages: int, page_size: int) -> None:
    """Host check of attention_varlen's paged metadata (a device-to-host copy for GPU tensors):
    each sequence's key count -- seqused_k[b], else cu_seqlens_k[b + 1] - cu_seqlens_k[b] -- in
    [0, capacity] (max_pages x page_size), and every block-table entry of a page it uses in
    [0, num_pages). Raises a ValueError naming the argument, the sequence and the value."""
    capacity = block_table.shape[1] * page_size
    if seqused_k is not None:
        name, keys = "seqused_k", seqused_k.cpu().long()
    else:
        cu = cu_seqlens_k.cpu().long()
        name, keys = "cu_seqlens_k", cu[1:] - cu[:-1]
    bad = ((keys < 0) | (keys > capacity)).nonzero()
    if bad.numel():
        b = int(bad[0])
        what = f"entry {b} is {int(keys[b])}" if seqused_k is not None else (
            f"sequence {b} has {int(keys[b])} keys (entries {b}, {b + 1}: {int(cu[b])}, {int(cu[b + 1])})")
        raise ValueError(f"{name}: {what}; a sequence's keys must be from 0 to its capacity {capacity} "
                         f"({block_table.shape[1]} pages of {page_size} in block_table)")
    bad = _bad_entry(block_table, keys, num_pages, page_size)
    if bad is not None:
        row, col, value = bad
        raise ValueError(f"block_table: row {row}, entry {col} is {value}, a page the sequence uses "
                         f"({int(keys[row])} keys); pages are 0 to {num_pages - 1} (k holds {num_pages})")
