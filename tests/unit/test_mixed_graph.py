"""Mixed-step CUDA graphs (runner/mixed_graph.py) on CPU: the padded layout a graph replays
(runner/step_layout.py) is the eager step's layout plus rows and slots that change nothing, checked
through the real model with the reference attention. The capture itself needs CUDA
(tests/gpu/test_cuda_path.py::test_mixed_step_graphs_give_the_eager_tokens)."""
from __future__ import annotations

import collections

import pytest
import torch

from tritongen import LLM
from tritongen.ops.attention import AttentionMetadata
from tritongen.runner.mixed_graph import MAX_PROMPTS, MixedGraphs, token_buckets
from tritongen.runner.step_layout import step_layout
from tritongen.types import SamplingParams, ScheduledSeq, SchedulerOutput

BS = 4


def seq(rid: str, start: int, n: int, blocks: list[int], sample: bool = True, **params) -> ScheduledSeq:
    """A request feeding n tokens at positions start.. (ids from its name), its cache in `blocks`."""
    base = 3 + 7 * (ord(rid[-1]) % 11)
    return ScheduledSeq(request_id=rid, token_ids=[base + i for i in range(start, start + n)], start_pos=start,
                        block_table=blocks, do_sample=sample, params=SamplingParams(**params),
                        prompt_token_ids=[base + i for i in range(start + n)], output_token_ids=[])


def test_buckets_step_by_32_then_128_and_end_at_the_budget() -> None:
    assert token_buckets(2048)[:3] == [32, 64, 96] and token_buckets(2048)[-3:] == [1792, 1920, 2048]
    assert token_buckets(8192)[-1] == 2048 and len(set(token_buckets(8192))) == 40  # larger steps run eagerly
    assert token_buckets(500) == [*range(32, 500, 32), 500]


def test_layout_pads_tokens_without_slots_and_sequences_without_queries() -> None:
    seqs = [seq("a", 9, 1, [2, 5, 7]), seq("b", 0, 5, [4, 6], sample=False), seq("c", 3, 1, [1])]
    assert step_layout(seqs, BS).ids == seqs[0].token_ids + seqs[1].token_ids + seqs[2].token_ids  # unpadded
    lay = step_layout(seqs, BS, tokens=12, slots=5)
    assert lay.ids[:7] == seqs[0].token_ids + seqs[1].token_ids + seqs[2].token_ids and lay.ids[7:] == [0] * 5
    assert lay.positions[:7] == [9, 0, 1, 2, 3, 4, 3]
    assert lay.slot_mapping == [7 * BS + 1, 4 * BS, 4 * BS + 1, 4 * BS + 2, 4 * BS + 3, 6 * BS, 1 * BS + 3] + [-1] * 5
    assert lay.query_start_loc == [0, 1, 6, 7, 7, 7] and lay.seq_lens == [10, 5, 4, 0, 0]
    assert lay.prompt_seqs == [1]
    assert lay.logits_rows == [0, 6]  # b's chunk does not sample
    assert lay.block_tables == [[2, 5, 7], [4, 6, 0], [1, 0, 0]]  # the real sequences', to the widest
    with pytest.raises(ValueError, match="does not fit"):
        step_layout(seqs, BS, tokens=6, slots=5)
    with pytest.raises(ValueError, match="does not fit"):
        step_layout(seqs, BS, tokens=12, slots=2)


def test_bucket_takes_the_smallest_that_fits_and_counts_why_the_rest_run_eagerly() -> None:
    g = MixedGraphs.__new__(MixedGraphs)
    g.sizes, g.slots, g.width, g.eager_steps = token_buckets(256), 4, 3, collections.Counter()
    assert g.bucket([seq("a", 9, 1, [2, 5, 7]), seq("b", 0, 40, list(range(10)))]) is None  # table too wide
    assert g.bucket([seq("a", 9, 1, [2, 5, 7]), seq("b", 0, 40, [1])]) == 64
    assert g.bucket([seq("b", 0, 300, [1])]) is None  # past the largest bucket
    assert g.bucket([seq("b", 0, 290, [1])]) is None
    assert g.bucket([seq(f"r{i}", 0, 1, [1]) for i in range(5)]) is None  # more sequences than slots
    assert g.bucket([seq("b", 0, 8, [1], prompt_logprobs=1)]) is None
    g.slots = 2 * MAX_PROMPTS
    assert g.bucket([seq(f"p{i}", 0, 2, [1]) for i in range(MAX_PROMPTS + 1)]) is None
    assert g.eager_steps == {"a block table past 3 blocks": 1, "more tokens than the largest bucket (256)": 2,
                             "more sequences than slots (4)": 1, "prompt logprobs (they read every row)": 1,
                             f"more than {MAX_PROMPTS} prompts": 1}


@pytest.mark.parametrize("tokens, slots", [(16, 5), (64, 9)])
def test_the_padded_layout_computes_the_eager_rows(tokens: int, slots: int) -> None:
    """The real model (tiny Llama, float32, reference attention): a mixed step's hidden states at
    its own rows are the same whether laid out as the eager step or padded as its graph replays it."""
    llm = LLM("dummy:tiny-llama", device="cpu", dtype="float32", block_size=BS, num_blocks=32)
    runner = llm.engine.runner
    for kv in runner.kv_caches:
        kv.copy_(torch.randn_like(kv))
    seqs = [seq("a", 9, 1, [2, 5, 7]), seq("b", 0, 6, [4, 6]), seq("c", 3, 1, [1]), seq("d", 4, 3, [8, 9])]
    eager = runner._prepare(SchedulerOutput(seqs=seqs))
    start = [kv.clone() for kv in runner.kv_caches]
    with torch.inference_mode():
        want = runner.model(eager.input_ids, eager.positions, runner.kv_caches, eager.attn)
        written = [kv.clone() for kv in runner.kv_caches]
        for kv, s0 in zip(runner.kv_caches, start):  # each layout from the same cache
            kv.copy_(s0)
        lay = step_layout(seqs, BS, tokens, slots)
        width = max(len(s.block_table) for s in seqs)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(lay.slot_mapping),
            query_start_loc=torch.tensor(lay.query_start_loc, dtype=torch.int32),
            seq_lens=torch.tensor(lay.seq_lens, dtype=torch.int32),
            block_tables=torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
                                      + [[0] * width] * (slots - len(seqs)), dtype=torch.int32),
            query_start_loc_cpu=lay.query_start_loc, seq_lens_cpu=lay.seq_lens, block_size=BS)
        got = runner.model(torch.tensor(lay.ids), torch.tensor(lay.positions), runner.kv_caches, meta)
    n = len(eager.input_ids)
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)
    # The same slots written, and no others: a stray write puts a computed K/V over the cache's random
    # values (off by ~1); the rows' own K/V differ only in the GEMM's rounding for another row count.
    for kv, w in zip(runner.kv_caches, written):
        torch.testing.assert_close(kv, w, atol=1e-5, rtol=1e-5)
    assert lay.logits_rows == eager.logits_indices.tolist()
