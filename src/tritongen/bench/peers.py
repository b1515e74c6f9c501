"""Our engine and a peer engine (vLLM, or LMDeploy's PyTorch engine) side by side on one HF
checkpoint: the dummy weights saved once as safetensors, the in-process workloads both run the
same way (batch-1 decode, offline throughput over token ids), and the command that starts each
one's OpenAI server. benchmarks/peer_suite.py drives them (docs/bench.md, "Peers on the GPU machine").

A peer is imported only when asked for (`make_side("vllm", ...)`); when it is not installed the
error says how to get it onto the GPU machine.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

PEERS = ("vllm", "lmdeploy")
STAMP = "tritongen_checkpoint.json"
"""Written last into a saved checkpoint: what it holds. A directory without it is incomplete."""


# -- the checkpoint both load ---------------------------------------------------------------------

def save_checkpoint(model: str, out: Path, tokenizer_dir: Optional[str], dtype: str = "bfloat16",
                    device: str = "cpu", seed: int = 0) -> dict:
    """Write `dummy:<preset>` as an HF checkpoint (config.json, model.safetensors, the tokenizer's
    files) in `out`, or reuse `out` when its stamp says it holds the same model, dtype and seed.
    Returns the stamp plus `reused` and `seconds`."""
    import torch
    from safetensors.torch import save_file

    from tritongen.models.loader import hf_config_dict, load_model
    from tritongen.runner.model_runner import resolve_device

    want = {"model": model, "dtype": dtype, "seed": seed, "tokenizer": str(tokenizer_dir or "")}
    stamp_path = out / STAMP
    if stamp_path.exists():
        have = json.loads(stamp_path.read_text())
        if {k: have.get(k) for k in want} == want:
            return {**have, "reused": True, "seconds": 0.0}
    t0 = time.monotonic()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    net, _ = load_model(model, getattr(torch, dtype), resolve_device(device), seed=seed)
    config = hf_config_dict(model)
    config["torch_dtype"] = dtype
    state = {name: t.detach().to("cpu").contiguous() for name, t in net.hf_state_dict().items()}
    del net
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # safetensors refuses shared tensors; loaders re-tie
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    del state
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer_dir:
        for f in Path(tokenizer_dir).iterdir():
            if f.is_file() and f.name not in ("config.json", STAMP) and f.suffix != ".safetensors":
                shutil.copy2(f, tmp / f.name)
    stamp = {**want, "bytes": nbytes, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (tmp / STAMP).write_text(json.dumps(stamp, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return {**stamp, "reused": False, "seconds": time.monotonic() - t0}


# -- the engines ------------------------------------------------------------------------------------

def cli_flags(options: dict) -> list[str]:
    """Keyword arguments as a server's flags: --max-num-seqs 256, --flag / --no-flag, JSON for dicts."""
    out = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            out += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return out


class OursSide:
    """tritongen's LLM on the checkpoint, with the engine options given (prefix caching off)."""

    name = "tritongen"

    def __init__(self, model_dir: str, options: dict) -> None:
        from tritongen import LLM

        self.llm = LLM(**{**options, "model": model_dir, "tokenizer": model_dir})
        self.config = {"max_num_seqs": self.llm.config.scheduler.max_num_seqs,
                       "kv_blocks": self.llm.engine.runner.num_blocks}

    def generate(self, prompts: list[list[int]], output_lens: list[int]) -> list[int]:
        """Output token counts of greedy, fixed-length generations (ignore_eos)."""
        from tritongen.bench.offline import fixed_length_params

        outs = self.llm.generate(prompts, [fixed_length_params(n) for n in output_lens])
        return [o.num_output_tokens for o in outs]

    def close(self) -> None:
        if hasattr(self.llm, "shutdown"):
            self.llm.shutdown()
        del self.llm

    @staticmethod
    def server_command(model_dir: str, port: int, options: dict) -> list[str]:
        return [sys.executable, "-m", "tritongen.cli", "serve", "--frontend", "openai", "--host", "127.0.0.1",
                "--port", str(port), *cli_flags({**options, "model": model_dir, "tokenizer": model_dir})]


SITES = {"vllm": "/tmp/peer-site", "lmdeploy": "/tmp/peer-site-lmdeploy"}
"""Where benchmarks/peers/install_<peer>.sh installs each peer on the GPU machine."""


def import_peer(peer: str):
    import importlib

    try:
        return importlib.import_module(peer)
    except ImportError as exc:
        raise SystemExit(
            f"--peer {peer}: {peer} is not importable ({exc}). On the GPU machine build it from the carried "
            f"parts (benchmarks/peers/install_{peer}.sh) and put its site first: "
            f"PYTHONPATH={SITES[peer]}:$PYTHONPATH; here, use --peer none") from exc


class VllmSide:
    """vllm.LLM on the checkpoint: same dtype and seed, prefix caching off; `kwargs` adds engine
    arguments (what --vllm-kwargs gives, also passed to its server as flags)."""

    name = "vllm"

    def __init__(self, model_dir: str, dtype: str, seed: int, kwargs: dict) -> None:
        vllm = import_peer("vllm")
        self.vllm = vllm
        self.llm = vllm.LLM(model=model_dir, tokenizer=model_dir, dtype=dtype, seed=seed, enable_prefix_caching=False,
                            **kwargs)
        self.config = {"version": vllm.__version__, **kwargs}
        try:  # the scheduler's effective limits (its defaults depend on the GPU and on LLM vs server)
            sched = self.llm.llm_engine.vllm_config.scheduler_config
            self.config.update(max_num_seqs=sched.max_num_seqs, max_num_batched_tokens=sched.max_num_batched_tokens)
        except AttributeError:
            pass

    def generate(self, prompts: list[list[int]], output_lens: list[int]) -> list[int]:
        from vllm.inputs import TokensPrompt

        params = [self.vllm.SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
                  for n in output_lens]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outs]

    def close(self) -> None:
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if hasattr(core, "shutdown"):  # the engine-core process holds the GPU memory
            core.shutdown()
        del self.llm

    @staticmethod
    def server_command(model_dir: str, port: int, dtype: str, seed: int, kwargs: dict) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--tokenizer",
                model_dir, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--seed", str(seed),
                "--no-enable-prefix-caching", *cli_flags(kwargs)]


def lmdeploy_engine_config(dtype: str, kwargs: dict) -> dict:
    """PytorchEngineConfig's arguments: the checkpoint's dtype, prefix caching off, then `kwargs`."""
    return {"dtype": dtype, "enable_prefix_caching": False, **kwargs}


def lmdeploy_flags(options: dict) -> list[str]:
    """PytorchEngineConfig fields as `lmdeploy serve api_server` flags (same names, dashed). Its
    switches are store_true only: True gives the flag, False leaves it out (the default)."""
    return cli_flags({k: v for k, v in options.items() if v is not False})


class LmdeploySide:
    """lmdeploy.pipeline with its PyTorch engine (TurboMind is stripped from the carried wheel) on
    the checkpoint: same dtype, prefix caching off; `kwargs` adds PytorchEngineConfig fields (what
    --lmdeploy-kwargs gives, also passed to its server as flags). Greedy and ignore_eos as ours."""

    name = "lmdeploy"

    def __init__(self, model_dir: str, dtype: str, kwargs: dict) -> None:
        lmdeploy = import_peer("lmdeploy")
        self.lmdeploy = lmdeploy
        engine = lmdeploy.PytorchEngineConfig(**lmdeploy_engine_config(dtype, kwargs))
        self.pipe = lmdeploy.pipeline(model_dir, backend_config=engine, log_level="WARNING")
        self.config = {"version": lmdeploy.__version__, "backend": "pytorch", **kwargs,
                       "max_batch_size": engine.max_batch_size, "session_len": engine.session_len,
                       "block_size": engine.block_size, "cache_max_entry_count": engine.cache_max_entry_count}

    def generate(self, prompts: list[list[int]], output_lens: list[int]) -> list[int]:
        """Token-id prompts go in as `input_ids`: Pipeline.infer passes only messages, so this feeds
        Pipeline._infer the requests infer would build (LMDeploy 0.18.0), one session each."""
        gens = [self.lmdeploy.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False, ignore_eos=True)
                for n in output_lens]
        requests = [{"session_id": self.pipe.session_mgr.get(), "messages": None, "input_ids": list(p),
                     "gen_config": g, "stream_response": False} for p, g in zip(prompts, gens)]
        counts = []
        for stream in self.pipe._infer(iter(requests), multiplex=False):
            res = None
            for out in stream:
                res = res.extend(out) if res else out
            if res is None or res.finish_reason == "error":
                raise RuntimeError(f"lmdeploy: request {len(counts)} failed: {getattr(res, 'error_message', None)}")
            counts.append(res.generate_token_len)
        return counts

    def close(self) -> None:
        self.pipe.close()  # stops the engine loop and frees its cache
        del self.pipe

    @staticmethod
    def server_command(model_dir: str, port: int, dtype: str, kwargs: dict) -> list[str]:
        return [sys.executable, "-m", "lmdeploy", "serve", "api_server", model_dir, "--backend", "pytorch",
                "--server-name", "127.0.0.1", "--server-port", str(port), "--log-level", "WARNING",
                *lmdeploy_flags(lmdeploy_engine_config(dtype, kwargs))]


# -- workloads, the same code for both --------------------------------------------------------------

def bs1_prompts(vocab: int, input_len: int, n: int, seed: int) -> list[list[int]]:
    """n different prompts (no prefix-cache hit even where caching is on)."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(input_len)] for _ in range(n)]


def bs1(side, prompts: list[list[int]], output_len: int) -> dict:
    """Batch-1 generation of output_len tokens, wall time per request (first prompt: warm-up).
    The time of a 1-token request gives the decode rate: (t(n) - t(1)) / (n - 1)."""
    side.generate([prompts[0]], [output_len])
    one, full = [], []
    for p in prompts[1:]:
        t0 = time.perf_counter()
        side.generate([p], [1])
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = side.generate([p], [output_len])[0]
        full.append(time.perf_counter() - t0)
        if n != output_len:
            raise RuntimeError(f"{side.name}: {n} output tokens, asked for {output_len}")
    e2e, first = min(full), min(one)
    return {"input_len": len(prompts[0]), "output_len": output_len, "iters": len(full), "e2e_s": e2e,
            "tok_s": output_len / e2e, "one_token_s": first,
            "decode_ms_per_step": 1e3 * (e2e - first) / max(output_len - 1, 1), "e2e_all_s": full}


def offline(side, prompts: list[list[int]], output_lens: list[int]) -> dict:
    """Every request at once through the side's generate; throughput of the whole batch."""
    side.generate([prompts[0][:8]], [2])  # warm-up
    t0 = time.perf_counter()
    counts = side.generate(prompts, output_lens)
    elapsed = time.perf_counter() - t0
    prompt_tokens, out_tokens = sum(len(p) for p in prompts), sum(counts)
    return {"num_requests": len(prompts), "elapsed_time": elapsed, "prompt_tokens": prompt_tokens,
            "completion_tokens": out_tokens, "rps": len(prompts) / elapsed, "output_tok_s": out_tokens / elapsed,
            "total_tok_s": (prompt_tokens + out_tokens) / elapsed,
            "lengths_ok": counts == list(output_lens)}


def make_side(name: str, plan: dict):
    """The side a worker process runs: "tritongen" or a peer's name, from the plan's settings."""
    if name == OursSide.name:
        return OursSide(plan["model_dir"], plan["ours_options"])
    if name == "vllm":
        return VllmSide(plan["model_dir"], plan["dtype"], plan["seed"], plan["vllm_kwargs"])
    if name == "lmdeploy":
        return LmdeploySide(plan["model_dir"], plan["dtype"], plan["lmdeploy_kwargs"])
    raise ValueError(f"unknown side {name!r}; choose from {OursSide.name}, {', '.join(PEERS)}")


def run_worker(name: str, plan: dict) -> dict:
    """The in-process workloads of one side (what plan["workloads"] names), in this process."""
    ceilings = _ceilings(plan["dtype"])  # before the engine takes the device's memory
    t0 = time.monotonic()
    side = make_side(name, plan)
    out: dict = {"side": name, "start_s": time.monotonic() - t0, "config": side.config, "env": _env(),
                 **({"ceilings": ceilings} if ceilings else {})}
    print(f"[{name}] engine ready in {out['start_s']:.1f} s: {side.config}", flush=True)
    if "bs1" in plan["workloads"]:
        out["bs1"] = bs1(side, plan["bs1_prompts"], plan["bs1_output_len"])
        print(f"[{name}] bs1: {out['bs1']['tok_s']:.1f} tok/s, {out['bs1']['decode_ms_per_step']:.3f} ms/step",
              flush=True)
    if "offline" in plan["workloads"]:
        out["offline"] = offline(side, plan["offline_prompts"], plan["offline_output_lens"])
        print(f"[{name}] offline: {out['offline']['rps']:.2f} req/s, {out['offline']['output_tok_s']:.0f} out tok/s",
              flush=True)
    side.close()
    return out


def _ceilings(dtype: str) -> Optional[dict]:
    """This GPU's measured copy bandwidth (read + write) and GEMM rate in `dtype`, the Hardware the
    table's floors use (an H100's are not DESIGN.md's H200 ones); None without CUDA. Measured in a
    child process, which also asks whether there is CUDA, so this one touches no GPU before the
    peer's engine starts: a peer sizes its KV cache from the device's total memory (vLLM's
    gpu_memory_utilization), and the 4.7 GB a measurement in place kept made vLLM's offline run go
    out of memory on an H100; and after even `torch.cuda.is_available()` here, a forked child
    cannot use CUDA, which vLLM's engine core (forked unless CUDA is initialized here) met."""
    measured = ceilings_in_child(dtype, "cuda", 4 << 30, 8192)
    return None if measured is None else {"bandwidth": measured["bandwidth"], "flops": measured["flops"]}


def ceilings_in_child(dtype: str, device: str, copy_bytes: int, gemm_n: int) -> Optional[dict]:
    """measure_ceilings in a fresh Python process (this one's interpreter and sys.path), so that
    none of the device memory it takes stays with the caller; its answer plus the child's pid, or
    None when `device` is cuda and the child finds none."""
    import subprocess

    code = ("import json, os, sys, torch; from tritongen.bench.peers import measure_ceilings; "
            "print(json.dumps(None if sys.argv[2] == 'cuda' and not torch.cuda.is_available() else "
            "{**measure_ceilings(*sys.argv[1:3], *map(int, sys.argv[3:])), 'pid': os.getpid()}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code, dtype, device, str(copy_bytes), str(gemm_n)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"measuring the device's ceilings failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_ceilings(dtype: str, device: str, copy_bytes: int, gemm_n: int) -> dict:
    """Copy bandwidth over `copy_bytes` and the rate of a gemm_n-cubed matmul in `dtype`, here."""
    from tritongen.bench.gpu_suite_common import copy_bandwidth, gemm_flops

    return {"bandwidth": copy_bandwidth(device, copy_bytes), "flops": gemm_flops(device, gemm_n, dtype)}


def _env() -> dict:
    import platform

    info = {"python": platform.python_version(), "pythonpath": os.environ.get("PYTHONPATH", "")}
    for pkg in ("torch", "transformers", "triton", *PEERS):
        mod = sys.modules.get(pkg)
        info[pkg] = getattr(mod, "__version__", None) if mod else None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def check_available(peer: str) -> None:
    """Fail at once, with the way to install it, when `peer` is not importable (nothing imported)."""
    import importlib.util

    if peer in PEERS and importlib.util.find_spec(peer) is None:
        import_peer(peer)
