"""Torch-free fakes for core tests: a runner whose 'KV cache' stores tokens in paged slots.

The fake model's next token is a hash of the whole context read back through the block table,
so any mistake in block tables, prefix-cache reuse, chunking or preemption changes the output.
"""
from __future__ import annotations

from tritongen.types import ModelOutput, SchedulerOutput, TokenLogprob

VOCAB = 1000
EOS = 999


def next_token(context: tuple[int, ...]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(context)) * 2654435761 + len(context)) % (VOCAB - 1)


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int, eos_after: dict | None = None) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.slots: dict[int, int] = {}
        self.steps: list[SchedulerOutput] = []
        self.eos_after = eos_after or {}  # request_id -> emit EOS once this many tokens were generated
        self.dropped: list[str] = []
        self.last_ids: list[int] = []

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        self.steps.append(sched)
        self.dropped.extend(sched.finished_request_ids)
        bs = self.block_size
        ids, lps = [], []
        # An asynchronous step decodes the ids sampled last step (a device would read them there);
        # its seqs' output lists do not hold that token yet.
        rows = sched.previous_rows or []
        assert not rows or len(self.last_ids) == sched.num_previous
        for row, s in enumerate(sched.seqs):
            ahead = row < len(rows)
            for i, tok in enumerate([self.last_ids[rows[row]]] if ahead else s.token_ids):
                p = s.start_pos + i
                self.slots[s.block_table[p // bs] * bs + p % bs] = tok
            if not s.do_sample:
                continue
            ctx = tuple(self.slots[s.block_table[p // bs] * bs + p % bs] for p in range(s.seq_len))
            n_out = len(s.output_token_ids) + ahead
            tok = EOS if self.eos_after.get(s.request_id) == n_out else next_token(ctx)
            ids.append(tok)
            lps.append(TokenLogprob(tok, -0.5) if s.params.logprobs is not None else None)
        self.last_ids = ids
        return ModelOutput(ids, lps)


def expected_tokens(prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    out = []
    for _ in range(n):
        t = next_token(tuple(ctx))
        out.append(t)
        ctx.append(t)
    return out


class CharTokenizer:
    """Each token id is one character (chr(id + 32)); good enough for stop-string logic."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - 32 for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i + 32) for i in ids if not (skip_special_tokens and i == EOS))
