"""The multi-replica check: N `tritongen serve --frontend openai` replicas on 127.0.0.1, a
shared-prefix workload sent through round-robin and through the picker's scoring
(tritongen.bench.routing), and each policy's prefix-cache hit rate and TTFT.

    python -m tritongen.bench.replicas --replicas 3 --model dummy:tiny-llama

The replicas are OpenAI-front servers: the endpoint picker routes OpenAI requests (the model
server protocol of the Gateway API Inference Extension), and the engine, its prefix cache and its
metrics are the same under both fronts. Each policy gets its own prefix groups, so the second run
finds nothing of the first in the caches. The hit rate is the replicas' own: the growth of
tritongen_prefix_cache_hit_ratio x tritongen_prompt_tokens_total (prompt tokens served from the
cache) over the growth of tritongen_prompt_tokens_total, summed over the replicas.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tritongen.bench.corpus import corpus_lines
from tritongen.bench.routing import PickerRouter, ReplicaState, RoundRobin, parse_picker_metrics
from tritongen.netutil import free_ports


@dataclass
class Replica:
    url: str
    process: subprocess.Popen


@dataclass
class PolicyResult:
    policy: str
    hit_rate: float
    ttft_mean: float
    ttft_p50: float
    per_replica: dict[str, int] = field(default_factory=dict)
    """Requests each replica got."""
    preemptions: float = 0.0


def shared_prefix_workload(groups: int, per_group: int, prefix_lines: int, seed: int,
                           first_group: int = 0) -> list[str]:
    """groups x per_group prompts: a long shared prefix (a system prompt: `prefix_lines` corpus
    lines) per group and a distinct question after it, in a random order of arrival."""
    lines = corpus_lines(min_words=6)
    prompts = []
    for g in range(first_group, first_group + groups):
        start = (g * (prefix_lines + per_group)) % (len(lines) - prefix_lines - per_group)
        prefix = "\n".join(lines[start:start + prefix_lines])
        for q in range(per_group):
            prompts.append(f"{prefix}\n\nQuestion {q}: {lines[start + prefix_lines + q]}\nAnswer:")
    random.Random(seed).shuffle(prompts)
    return prompts


def start_replicas(n: int, model: str, engine_args: list[str], timeout: float = 180.0) -> list[Replica]:
    """Start n OpenAI-front replicas and wait until every /health answers 200."""
    import httpx

    replicas = []
    for port in free_ports(n):
        cmd = [sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", "--model", model,
               "--host", "127.0.0.1", "--port", str(port), *engine_args]
        # One torch thread each: n replicas share the machine's cores.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        replicas.append(Replica(f"http://127.0.0.1:{port}", proc))
    deadline = time.monotonic() + timeout
    try:
        for r in replicas:
            while True:
                if r.process.poll() is not None:
                    raise RuntimeError(f"replica {r.url} exited: {r.process.stderr.read()[-2000:]}")
                try:
                    if httpx.get(r.url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"replica {r.url} not healthy after {timeout:.0f} s")
                time.sleep(0.2)
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def stop_replicas(replicas: list[Replica]) -> None:
    for r in replicas:
        if r.process.poll() is None:
            r.process.terminate()
    for r in replicas:
        try:
            r.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            r.process.kill()
            r.process.wait()


def _served(text: str) -> dict[str, float]:
    """Prompt tokens, estimated cache hits and preemptions from one replica's exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("tritongen_prompt_tokens_total", "tritongen_prefix_cache_hit_ratio",
                               "tritongen_num_preemptions_total"):
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    prompt = values.get("tritongen_prompt_tokens_total", 0.0)
    return {"prompt": prompt, "hits": prompt * values.get("tritongen_prefix_cache_hit_ratio", 0.0),
            "preemptions": values.get("tritongen_num_preemptions_total", 0.0)}


async def _scrape(client, urls: list[str]) -> tuple[dict[str, ReplicaState], dict[str, dict]]:
    texts = await asyncio.gather(*(client.get(u + "/metrics") for u in urls))
    return ({u: parse_picker_metrics(u, t.text) for u, t in zip(urls, texts)},
            {u: _served(t.text) for u, t in zip(urls, texts)})


async def _first_token_time(client, url: str, model: str, prompt: str, max_tokens: int) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    ttft = None
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                if json.loads(line[6:])["choices"][0].get("text"):
                    ttft = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError(f"{url}: no token came back")
    return ttft


async def run_policy(router, urls: list[str], model: str, prompts: list[str], concurrency: int,
                     max_tokens: int) -> PolicyResult:
    """Send `prompts` (at most `concurrency` at once) where `router` picks, scraping /metrics
    before each pick as the picker does between its refreshes."""
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        _, before = await _scrape(client, urls)
        ttfts: list[float] = []
        counts = {u: 0 for u in urls}
        pending = iter(prompts)
        lock = asyncio.Lock()

        async def worker() -> None:
            while True:
                async with lock:  # one pick at a time, each on fresh metrics
                    prompt = next(pending, None)
                    if prompt is None:
                        return
                    states, _ = await _scrape(client, urls)
                    url = router.pick(prompt, states)
                    counts[url] += 1
                ttfts.append(await _first_token_time(client, url, model, prompt, max_tokens))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        _, after = await _scrape(client, urls)
    prompt = sum(after[u]["prompt"] - before[u]["prompt"] for u in urls)
    hits = sum(after[u]["hits"] - before[u]["hits"] for u in urls)
    return PolicyResult(router.name, hits / prompt if prompt else 0.0, statistics.fmean(ttfts),
                        statistics.median(ttfts), counts,
                        sum(after[u]["preemptions"] - before[u]["preemptions"] for u in urls))


def compare(urls: list[str], model: str, groups: int, per_group: int, prefix_lines: int, concurrency: int,
            max_tokens: int, seed: int = 0) -> list[PolicyResult]:
    """Round-robin, then the picker's scoring, each over its own shared-prefix groups."""
    results = []
    for i, router in enumerate((RoundRobin(urls), PickerRouter(model, seed=seed))):
        prompts = shared_prefix_workload(groups, per_group, prefix_lines, seed + i, first_group=i * groups)
        results.append(asyncio.run(run_policy(router, urls, model, prompts, concurrency, max_tokens)))
    return results


def format_table(results: list[PolicyResult]) -> str:
    rows = ["| policy | prefix-cache hit rate | TTFT mean (ms) | TTFT p50 (ms) | requests per replica |",
            "|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r.policy} | {r.hit_rate:.1%} | {r.ttft_mean * 1e3:.1f} | {r.ttft_p50 * 1e3:.1f} | "
                    f"{' / '.join(str(n) for n in r.per_replica.values())} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--model", default="dummy:tiny-llama")
    p.add_argument("--groups", type=int, default=6, help="shared prefixes (system prompts) per policy")
    p.add_argument("--per-group", type=int, default=4, help="requests per prefix")
    p.add_argument("--prefix-lines", type=int, default=12, help="corpus lines per shared prefix")
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=2)
    p.add_argument("--num-blocks", type=int, default=48,
                   help="KV blocks per replica: too few to hold every prefix, enough for the prefixes of its share")
    p.add_argument("--seed", type=int, default=0)
    args, engine_args = p.parse_known_args(argv)
    engine_args = ["--device", "cpu", "--dtype", "float32", "--num-blocks", str(args.num_blocks),
                   "--max-num-seqs", str(max(args.concurrency, 1)), *engine_args]
    replicas = start_replicas(args.replicas, args.model, engine_args)
    try:
        results = compare([r.url for r in replicas], args.model, args.groups, args.per_group,
                          args.prefix_lines, args.concurrency, args.max_tokens, args.seed)
    finally:
        stop_replicas(replicas)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
