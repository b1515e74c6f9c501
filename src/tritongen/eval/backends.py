"""Where `eval task` gets generations and loglikelihoods: our engine in process, or an OpenAI server.

Both answer the same two questions, so a task scores the same through either:
  generate(items)            greedy text for each generation item;
  loglikelihood(pairs)       for (context ids, continuation ids): the summed logprob of the
                             continuation and whether every one of its tokens is the argmax.
The engine uses prompt logprobs (SamplingParams.prompt_logprobs); the OpenAI server the same
through /v1/completions with echo=true, logprobs=1, max_tokens=0 (lm-eval's path).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from tritongen.eval.tasks import GenItem
from tritongen.types import SamplingParams

LogLik = tuple[float, bool]


def split_tokens(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of context and continuation as the model sees them together (lm-eval's rule: encode
    the whole string and cut where the context's own encoding ends, when it is a prefix)."""
    ctx = tokenizer.encode(context, add_special_tokens=False)
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    if whole[:len(ctx)] == ctx and len(whole) > len(ctx):
        return ctx, whole[len(ctx):]
    return ctx, tokenizer.encode(continuation, add_special_tokens=False)


class EngineBackend:
    """Our engine in this process (LLM.generate), batched."""

    name = "engine"

    def __init__(self, llm) -> None:
        self.llm = llm
        self.tokenizer = llm.tokenizer

    def generate(self, items: list[GenItem]) -> list[str]:
        params = [SamplingParams(temperature=0.0, max_tokens=it.max_tokens, stop=it.stop) for it in items]
        return [o.text for o in self.llm.generate([it.prompt for it in items], params)]

    def loglikelihood(self, pairs: list[tuple[list[int], list[int]]]) -> list[LogLik]:
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        outs = self.llm.generate([ctx + cont for ctx, cont in pairs], params)
        results = []
        for (ctx, cont), out in zip(pairs, outs):
            entries = out.prompt_logprobs[len(ctx):len(ctx) + len(cont)]
            total = sum(e.logprob for e in entries)
            greedy = all(not e.top or e.top[0][0] == e.token_id or e.logprob >= e.top[0][1] for e in entries)
            results.append((total, greedy))
        return results


class OpenAIBackend:
    """An OpenAI-compatible server's /v1/completions (ours, or any other), a few requests at a time."""

    name = "openai"

    def __init__(self, url: str, tokenizer, model: Optional[str] = None, api_key: Optional[str] = None,
                 concurrency: int = 8, timeout: float = 300.0) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.model = model or self._first_model()
        self.concurrency = concurrency

    def _first_model(self) -> str:
        r = self.client.get("/v1/models")
        r.raise_for_status()
        return r.json()["data"][0]["id"]

    def _post(self, body: dict) -> dict:
        r = self.client.post("/v1/completions", json={"model": self.model, "temperature": 0.0, **body})
        if r.status_code != 200:
            raise RuntimeError(f"{self.url}/v1/completions answered {r.status_code}: {r.text[:300]}")
        return r.json()

    def _map(self, fn, xs: list) -> list:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(fn, xs))

    def generate(self, items: list[GenItem]) -> list[str]:
        def one(it: GenItem) -> str:
            body = {"prompt": it.prompt, "max_tokens": it.max_tokens, "stop": it.stop or None}
            return self._post(body)["choices"][0]["text"]

        return self._map(one, items)

    def loglikelihood(self, pairs: list[tuple[list[int], list[int]]]) -> list[LogLik]:
        def one(pair: tuple[list[int], list[int]]) -> LogLik:
            ctx, cont = pair
            lp = self._post({"prompt": ctx + cont, "max_tokens": 0, "echo": True, "logprobs": 1})["choices"][0]["logprobs"]
            span = range(len(ctx), len(ctx) + len(cont))
            total = sum(lp["token_logprobs"][i] for i in span)
            greedy = all(lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) - 1e-6 for i in span)
            return total, greedy

        return self._map(one, pairs)

    def close(self) -> None:
        self.client.close()
