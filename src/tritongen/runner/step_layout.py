"""The flat layout of one step's tokens for the model: sequences in order, their new tokens
concatenated, where each token sits in the paged KV cache, and which rows sample. Pure Python:
the eager step uploads it as it is; a mixed step's CUDA graph (runner/mixed_graph.py) pads it to
its token bucket (rows that write no KV and belong to no sequence) and sequence slots (no queries).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tritongen.types import ScheduledSeq


@dataclass
class StepLayout:
    ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    """Cache slot of each token; -1 for padding rows (written nowhere)."""
    query_start_loc: list[int]
    seq_lens: list[int]
    prompt_seqs: list[int]
    """Sequences of several new tokens."""
    logits_rows: list[int]
    """Row of each sampling sequence's last token, in the step's order."""
    block_tables: list[list[int]]
    """Each sequence's blocks, padded with 0 to the step's longest table (no padding slots)."""


def step_layout(seqs: list[ScheduledSeq], block_size: int, tokens: Optional[int] = None,
                slots: Optional[int] = None) -> StepLayout:
    """The step's layout, padded to `tokens` rows and `slots` sequences when given."""
    ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    qsl = [0]
    seq_lens: list[int] = []
    prompts: list[int] = []
    logits_rows: list[int] = []
    for i, s in enumerate(seqs):
        ids.extend(s.token_ids)
        pos = range(s.start_pos, s.seq_len)
        positions.extend(pos)
        slot_mapping.extend(s.block_table[p // block_size] * block_size + p % block_size for p in pos)
        qsl.append(qsl[-1] + s.num_new_tokens)
        seq_lens.append(s.seq_len)
        if s.num_new_tokens > 1:
            prompts.append(i)
        if s.do_sample:
            logits_rows.append(qsl[-1] - 1)
    pad = (len(ids) if tokens is None else tokens) - len(ids)
    empty = (len(seqs) if slots is None else slots) - len(seqs)
    if pad < 0 or empty < 0:
        raise ValueError(f"a step of {len(ids)} tokens and {len(seqs)} sequences does not fit "
                         f"{tokens} tokens and {slots} sequences")
    width = max((len(s.block_table) for s in seqs), default=0)
    tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
    return StepLayout(ids + [0] * pad, positions + [0] * pad, slot_mapping + [-1] * pad, qsl + [qsl[-1]] * empty,
                      seq_lens + [0] * empty, prompts, logits_rows, tables)
