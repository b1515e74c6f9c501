"""Eval tasks: JSONL format, normalisation, built-in Shakespeare tasks, scoring through the engine
and through an OpenAI-style server (a fake one here; the real server in test_eval_openai.py)."""
import json

import pytest
import torch

from fake_servers import FakeOpenAIServer
from tritongen.cli import main
from tritongen.eval.backends import EngineBackend, OpenAIBackend, split_tokens
from tritongen.eval.task_runner import run_task
from tritongen.eval.tasks import GenItem, MCItem, gen_correct, load_task, normalize, parse_item


def test_normalisation_and_matching():
    assert normalize("  The  Paris!\n") == "paris"
    assert gen_correct(GenItem("q", ["Paris"]), " paris.")
    assert not gen_correct(GenItem("q", ["Paris"]), " Paris is the capital")
    assert gen_correct(GenItem("q", ["Paris"], match="first_word"), " Paris is the capital")
    assert gen_correct(GenItem("q", ["4", "four"]), "Four")


def test_jsonl_items(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in [
        {"prompt": "2+2=", "answer": "4", "max_tokens": 3, "stop": ["\n", " "]},
        {"prompt": "Sky is", "choices": [" blue", " green"], "answer": " blue"},
        {"prompt": "Grass is", "choices": [" blue", " green"], "answer": 1},
    ]))
    gen, mc1, mc2 = load_task(str(path))
    assert gen == GenItem("2+2=", ["4"], 3, ["\n", " "], "exact")
    assert (mc1.answer, mc2.answer) == (0, 1)
    with pytest.raises(ValueError, match="not one of"):
        parse_item({"prompt": "x", "choices": ["a"], "answer": "b"}, "here")


def test_builtin_tasks_are_deterministic_shakespeare():
    gen = load_task("builtin", limit=20)
    assert gen == load_task("builtin:lastword", limit=20, seed=0) and gen != load_task("builtin", limit=20, seed=1)
    assert all(isinstance(it, GenItem) and it.match == "first_word" and it.answers[0].isalpha() for it in gen)
    assert all(it.prompt.count("\n") == 3 for it in gen)
    mc = load_task("builtin:lastword-mc", limit=20)
    for g, m in zip(gen, mc):
        assert isinstance(m, MCItem) and m.prompt == g.prompt and len(m.choices) == 4
        assert m.choices[m.answer] == " " + g.answers[0]


@pytest.fixture(scope="module")
def llm():
    from tritongen import LLM

    return LLM("dummy:tiny-llama", device="cpu", dtype="float32", num_blocks=256)


def test_engine_loglikelihood_equals_hf_twin(llm):
    from tritongen.models.hf_twin import hf_twin

    backend = EngineBackend(llm)
    ctx, cont = split_tokens(llm.tokenizer, "To be or not to", " be, that is")
    (total, greedy), = backend.loglikelihood([(ctx, cont)])
    runner = llm.engine.runner
    hf = hf_twin(runner.model, runner.arch)
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([ctx + cont])).logits[0].float(), dim=-1)
    expected = sum(float(lp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))
    assert total == pytest.approx(expected, abs=1e-3)
    argmax = [int(lp[len(ctx) - 1 + i].argmax()) for i in range(len(cont))]
    assert greedy == (argmax == cont)


def test_builtin_tasks_through_the_engine_report_accuracy(llm):
    items = load_task("builtin", limit=4) + load_task("builtin:lastword-mc", limit=4)
    result = run_task(EngineBackend(llm), items)
    s = result["summary"]
    assert s["num_items"] == 8 and 0.0 <= s["accuracy"] <= 1.0
    assert 0.0 <= s["exact_match"] <= 1.0 and 0.0 <= s["acc"] <= 1.0 and 0.0 <= s["acc_norm"] <= 1.0
    assert all(len(r["loglikelihoods"]) == 4 for r in result["items"] if r["kind"] == "multiple_choice")


def test_openai_backend_speaks_echo_logprobs(tokenizer):
    items = [MCItem("Pick one:", [" a", " b"], 0), GenItem("Say", [" w0 w1"], max_tokens=2)]
    with FakeOpenAIServer(delay=0.0) as srv:
        backend = OpenAIBackend(srv.url, tokenizer)
        result = run_task(backend, items)
        backend.close()
        bodies = srv.requests
    assert backend.model == "fake-model"
    echo = [b for b in bodies if b.get("echo")]
    assert len(echo) == 2 and all(b["max_tokens"] == 0 and b["logprobs"] == 1 for b in echo)
    assert all(isinstance(b["prompt"], list) for b in echo)  # token ids: the split is ours, not the server's
    assert result["summary"]["num_items"] == 2 and 0.0 <= result["summary"]["accuracy"] <= 1.0


def test_cli_task_builtin(capsys):
    assert main(["eval", "task", "--target", "engine", "--model", "dummy:tiny-llama", "--device", "cpu",
                 "--task", "builtin", "--limit", "3", "--num-blocks", "128"]) == 0
    out = capsys.readouterr().out
    assert "exact match (generation)" in out and "accuracy: " in out
