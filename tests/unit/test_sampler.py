"""Sampler: greedy, penalties, filtering, seeded reproducibility, distribution and logprobs (CPU)."""
from __future__ import annotations

import math

import pytest
import torch

from tritongen.runner.sampler import Sampler
from tritongen.types import SamplingParams, ScheduledSeq

CPU = torch.device("cpu")


def make_seq(request_id="r", prompt=(1, 2, 3), output=(), eos=(0,), **params) -> ScheduledSeq:
    return ScheduledSeq(
        request_id=request_id,
        token_ids=[list(output)[-1] if output else prompt[-1]],
        start_pos=len(prompt) + len(output) - 1,
        block_table=[0],
        do_sample=True,
        params=SamplingParams(**params),
        prompt_token_ids=list(prompt),
        output_token_ids=list(output),
        eos_token_ids=tuple(eos),
    )


def random_logits(n, v, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, v, generator=g) * scale


def reference_penalties(row: list[float], seq: ScheduledSeq) -> list[float]:
    """Per-row, loop-by-loop HF repetition penalty then OpenAI presence/frequency penalties."""
    p = seq.params
    out = list(row)
    for t in set(seq.prompt_token_ids) | set(seq.output_token_ids):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(seq.output_token_ids):
        count = seq.output_token_ids.count(t)
        out[t] -= p.presence_penalty + p.frequency_penalty * count
    return out


def test_empty_batch():
    assert Sampler(10, CPU).sample(torch.zeros(0, 10), []) == ([], [])


def test_greedy_is_argmax():
    logits = random_logits(5, 100)
    seqs = [make_seq(f"r{i}", temperature=0.0) for i in range(5)]
    ids, lps = Sampler(100, CPU).sample(logits, seqs)
    assert ids == logits.argmax(-1).tolist()
    assert lps == [None] * 5


def test_greedy_with_penalties_matches_reference():
    v = 40
    logits = random_logits(4, v, seed=1)
    seqs = [
        make_seq("a", prompt=[1, 2, 3, 5], output=[5, 5, 7], temperature=0.0, repetition_penalty=1.7),
        make_seq("b", prompt=[4, 9], output=[9, 9, 9, 11, 12], temperature=0.0,
                 presence_penalty=0.5, frequency_penalty=0.8),
        make_seq("c", prompt=[3, 30], output=[30, 31, 31], temperature=0.0,
                 repetition_penalty=0.6, presence_penalty=-1.0, frequency_penalty=1.5),
        make_seq("d", prompt=[0, 1], output=[1, 2], temperature=0.0),  # no penalties
    ]
    # Make the penalized tokens the argmax so the penalties change the choice.
    for i, s in enumerate(seqs):
        logits[i, s.output_token_ids[-1]] = 10.0
    expected = torch.tensor([reference_penalties(logits[i].tolist(), s) for i, s in enumerate(seqs)])
    sampler = Sampler(v, CPU)
    penalized = logits.clone()
    sampler._apply_penalties(penalized, seqs, [0, 1, 2])
    torch.testing.assert_close(penalized, expected)
    ids, _ = sampler.sample(logits, seqs)
    assert ids == expected.argmax(-1).tolist()
    assert ids[3] == 2  # the unpenalized row still picks its boosted token


def test_sample_does_not_modify_input_logits():
    logits = random_logits(2, 30)
    before = logits.clone()
    seqs = [make_seq("a", output=[1, 1], repetition_penalty=2.0, min_tokens=5, temperature=0.7, top_k=5),
            make_seq("b", temperature=0.0, frequency_penalty=1.0, output=[3])]
    Sampler(30, CPU).sample(logits, seqs)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("filt", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_degenerate_filters_equal_greedy(filt):
    sampler = Sampler(200, CPU, seed=3)
    for step in range(5):
        logits = random_logits(8, 200, seed=step)
        seqs = [make_seq(f"r{i}", temperature=1.3, seed=(i if i % 2 else None), **filt) for i in range(8)]
        ids, _ = sampler.sample(logits, seqs)
        assert ids == logits.argmax(-1).tolist()


def test_min_tokens_masks_eos_and_stop_tokens():
    v = 20
    logits = torch.zeros(3, v)
    logits[:, 0] = 9.0  # eos
    logits[:, 5] = 8.0  # a stop token id
    logits[:, 7] = 7.0
    seqs = [
        make_seq("a", output=[3], eos=(0,), temperature=0.0, min_tokens=2, stop_token_ids=[5]),
        make_seq("b", output=[3, 4], eos=(0,), temperature=0.0, min_tokens=2, stop_token_ids=[5]),
        make_seq("c", output=[], eos=(0, 5), temperature=0.0, min_tokens=1, stop_token_ids=[99]),
    ]
    ids, _ = Sampler(v, CPU).sample(logits, seqs)
    assert ids == [7, 0, 7]


def test_min_tokens_never_samples_eos():
    logits = torch.zeros(500, 4)
    seqs = [make_seq("u", eos=(1, 2), min_tokens=1)] * 500
    ids, _ = Sampler(4, CPU).sample(logits, seqs)
    assert set(ids) == {0, 3}


def test_mixed_greedy_and_sampled_rows():
    logits = random_logits(6, 50, scale=0.5)
    seqs = [make_seq(f"r{i}", temperature=0.0 if i % 2 == 0 else 1.0) for i in range(6)]
    ids, _ = Sampler(50, CPU).sample(logits, seqs)
    greedy = logits.argmax(-1).tolist()
    assert [ids[i] for i in (0, 2, 4)] == [greedy[i] for i in (0, 2, 4)]


def _run_seeded(batches, steps=6, v=300):
    """Tokens of request 'x' over `steps` steps when batched as batches[step] describes."""
    sampler = Sampler(v, CPU, seed=123)
    tokens = []
    for step in range(steps):
        x_logits = random_logits(1, v, seed=1000 + step, scale=0.3)[0]  # flat: randomness decides
        layout = batches(step)
        rows, seqs = [], []
        for name in layout:
            if name == "x":
                rows.append(x_logits)
                seqs.append(make_seq("x", seed=42, temperature=0.9, top_p=0.95))
            else:
                rows.append(random_logits(1, v, seed=int(name[1:]) * 100 + step)[0])
                kind = int(name[1:]) % 3
                extra = [dict(seed=7), dict(), dict(temperature=0.0)][kind]
                seqs.append(make_seq(name, top_k=10, **extra))
        ids, _ = sampler.sample(torch.stack(rows), seqs)
        tokens.append(ids[layout.index("x")])
    return tokens


def test_seeded_rows_independent_of_batch():
    alone = _run_seeded(lambda step: ["x"])
    first = _run_seeded(lambda step: ["x", "o1", "o2", "o3"])
    last = _run_seeded(lambda step: ["o4", "o5", "o6", "o7", "x"])
    varying = _run_seeded(lambda step: (["o1", "o2"] * step)[:step] + ["x"] + ["o3"] * (step % 2))
    assert alone == first == last == varying
    assert len(set(alone)) > 1


def test_different_seeds_differ():
    v = 1000
    sampler = Sampler(v, CPU)
    logits = torch.zeros(2, v)
    a, b = [], []
    for _ in range(5):
        ids, _ = sampler.sample(logits, [make_seq("a", seed=1), make_seq("b", seed=2)])
        a.append(ids[0])
        b.append(ids[1])
    assert a != b


def test_drop_restarts_seeded_sequence():
    v = 1000
    sampler = Sampler(v, CPU)
    logits = torch.zeros(1, v)

    def three():
        return [sampler.sample(logits, [make_seq("a", seed=5)])[0][0] for _ in range(3)]

    first = three()
    continued = three()
    sampler.drop(["a", "never-seen"])
    restarted = three()
    assert first == restarted
    assert first != continued


def test_unseeded_sampler_is_deterministic_given_seed():
    logits = random_logits(16, 100, scale=0.5)
    seqs = [make_seq(f"r{i}") for i in range(16)]
    assert Sampler(100, CPU, seed=9).sample(logits, seqs) == Sampler(100, CPU, seed=9).sample(logits, seqs)


def test_empirical_distribution_matches_softmax():
    torch.manual_seed(0)
    base = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 2.0])
    n, v = 60_000, base.numel()
    sampler = Sampler(v, CPU, seed=0)
    # 200 seeded rows, the rest share one unseeded request (only seeded rows need distinct ids).
    seqs = [make_seq(f"s{i}", seed=i) for i in range(200)] + [make_seq("u")] * (n - 200)
    ids, _ = sampler.sample(base.expand(n, v).contiguous(), seqs)
    counts = torch.bincount(torch.tensor(ids), minlength=v).double()
    expected = torch.softmax(base.double(), -1) * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.5  # 99.9% quantile of chi-square with 5 degrees of freedom


def test_temperature_sharpens_distribution():
    base = torch.tensor([1.0, 0.0, -1.0])
    n = 20_000
    seqs = [make_seq("u", temperature=0.5)] * n
    ids, _ = Sampler(3, CPU, seed=1).sample(base.expand(n, 3).contiguous(), seqs)
    counts = torch.bincount(torch.tensor(ids), minlength=3).double()
    expected = torch.softmax(base.double() / 0.5, -1) * n
    assert ((counts - expected) ** 2 / expected).sum().item() < 13.8  # chi2(2) at 99.9%


def test_top_k_only_picks_top_k():
    n, v = 400, 50
    logits = random_logits(n, v, seed=4, scale=0.3)
    seqs = [make_seq(f"r{i}", top_k=3, temperature=2.0, seed=(i if i % 2 else None)) for i in range(n)]
    ids, _ = Sampler(v, CPU).sample(logits, seqs)
    top3 = logits.topk(3, dim=-1).indices
    assert all(t in top3[i].tolist() for i, t in enumerate(ids))
    assert len({(t in (top3[i, 1].item(), top3[i, 2].item())) for i, t in enumerate(ids)}) == 2


def test_top_p_keeps_smallest_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 2000
    logits = probs.log().expand(n, 4).contiguous()
    seqs = [make_seq("u", top_p=0.7)] * n
    ids, _ = Sampler(4, CPU).sample(logits, seqs)
    assert set(ids) == {0, 1}
    # top_p after top_k renormalizes: top_k=3 leaves [.53, .32, .16]; 0.5 keeps only token 0.
    seqs = [make_seq("u", top_k=3, top_p=0.5)] * n
    assert set(Sampler(4, CPU).sample(logits, seqs)[0]) == {0}


def test_min_p_drops_unlikely_tokens():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    n = 2000
    logits = probs.log().expand(n, 4).contiguous()
    seqs = [make_seq("u", min_p=0.6)] * n  # keeps p >= 0.24
    assert set(Sampler(4, CPU).sample(logits, seqs)[0]) == {0, 1}


def test_logprobs_are_raw_log_softmax():
    v = 64
    logits = random_logits(4, v, seed=7)
    seqs = [
        make_seq("a", logprobs=5, temperature=0.0, repetition_penalty=3.0, output=[1, 2]),
        make_seq("b"),
        make_seq("c", logprobs=0, temperature=0.7, top_k=4, seed=3),
        make_seq("d", logprobs=2, min_p=0.1),
    ]
    ids, lps = Sampler(v, CPU).sample(logits, seqs)
    ref = torch.log_softmax(logits, dim=-1)
    assert lps[1] is None
    for i, k in [(0, 5), (2, 0), (3, 2)]:
        lp = lps[i]
        assert lp.token_id == ids[i]
        assert lp.logprob == pytest.approx(ref[i, ids[i]].item(), abs=1e-5)
        assert len(lp.top) == k
        assert [t for t, _ in lp.top] == (ref[i].topk(k).indices.tolist() if k else [])
        assert all(x[1] >= y[1] for x, y in zip(lp.top, lp.top[1:]))
        for t, value in lp.top:
            assert isinstance(t, int)
            assert value == pytest.approx(ref[i, t].item(), abs=1e-5)


def test_all_rows_with_logprobs():
    logits = random_logits(3, 10)
    seqs = [make_seq(f"r{i}", temperature=0.0, logprobs=3) for i in range(3)]
    ids, lps = Sampler(10, CPU).sample(logits, seqs)
    assert ids == logits.argmax(-1).tolist()
    assert all(isinstance(t, int) for t in ids)
    for i in range(3):
        assert lps[i].top[0][0] == ids[i]
        assert math.isclose(lps[i].top[0][1], lps[i].logprob)


def test_padded_vocab_columns_are_never_sampled():
    logits = torch.zeros(100, 8)
    logits[:, 6:] = 50.0  # columns past vocab_size (e.g. an embedding padded for alignment)
    seqs = [make_seq(f"r{i}", temperature=0.0 if i == 0 else 1.0) for i in range(100)]
    ids, _ = Sampler(6, CPU).sample(logits, seqs)
    assert max(ids) < 6
