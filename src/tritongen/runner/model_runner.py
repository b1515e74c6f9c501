"""The torch side of a step: flat batch tensors -> model -> logits of the sampling rows -> sampler.

The paged KV cache is allocated once here. Per step only the small index tensors go to the
device and only the sampled ids (plus logprobs when asked) come back.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from tritongen.config import CacheConfig, ModelConfig, SchedulerConfig
from tritongen.models.arch import ModelArch
from tritongen.models.loader import load_model
from tritongen.ops import kernels
from tritongen.ops.attention import AttentionMetadata, select_attention_backend
from tritongen.ops.attention_metadata import mixed_prompt_seqs, set_kv_cache_scales
from tritongen.ops.fp8 import Fp8Linear
from tritongen.parallel import symmetric
from tritongen.runner.cuda_graph import maybe_build_graphs
from tritongen.runner.kv_cache import checkpoint_kv_scales, resolve_kv_cache_dtype
from tritongen.runner.mixed_graph import maybe_build_mixed_graphs
from tritongen.runner.sampler import Sampler
from tritongen.runner.step_layout import step_layout
from tritongen.types import ModelOutput, SchedulerOutput, TokenLogprob

if TYPE_CHECKING:
    from tritongen.parallel.tensor_parallel import Shard

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
    if name != "auto":
        if name not in _DTYPES:
            raise ValueError(f"unknown dtype {name!r}; choose from float32, bfloat16, float16, auto")
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32  # CPU matmuls in half precision are slow and inexact
    if checkpoint_dtype in ("float16", "bfloat16"):
        return _DTYPES[checkpoint_dtype]
    return torch.bfloat16


@dataclass
class _Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor


class ModelRunner:
    """One model replica, or with a tensor-parallel `shard` one rank of it. The driver (rank 0)
    samples; other ranks run the same forward passes and logits (they join its collectives) and
    return nothing."""

    def __init__(self, model_config: ModelConfig, cache_config: CacheConfig,
                 scheduler_config: SchedulerConfig, model_path: str,
                 shard: Optional["Shard"] = None, driver: bool = True) -> None:
        self.device = resolve_device(model_config.device)
        self.shard = shard
        if shard is not None and shard.world_size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", shard.rank)  # rank r drives the r-th visible GPU
            torch.cuda.set_device(self.device)
        torch.manual_seed(model_config.seed)
        from tritongen.models.loader import read_arch

        arch = read_arch(model_path)
        self.dtype = resolve_dtype(model_config.dtype, self.device, arch.torch_dtype)
        self.attention_backend = select_attention_backend(model_config.attention_backend, self.device)
        self.kv_cache_dtype = resolve_kv_cache_dtype(cache_config, self.dtype, self.device, self.attention_backend)
        split = None
        if shard is not None:
            from tritongen.parallel.tensor_parallel import model_split

            split = model_split(arch, shard)
        self.model, self.arch = load_model(model_path, self.dtype, self.device, seed=model_config.seed,
                                           split=split, quantization=model_config.quantization,
                                           quantize_lm_head=model_config.quantize_lm_head)
        self.model.eval()
        if self.device.type == "cuda":
            self.model.fuse_projections()  # fewer, larger GEMMs; the state dict keeps HF names
        self.block_size = cache_config.block_size
        self.num_blocks = self._agree(cache_config.num_blocks
                                      or self._num_blocks_from_memory(cache_config, scheduler_config))
        self.kv_caches = self._allocate_kv_cache(model_path)
        self.sampler = Sampler(self.arch.vocab_size, self.device, seed=model_config.seed) if driver else None
        self._pin = self.device.type == "cuda"
        self.kernels = kernels.KernelChoices(triton=self.attention_backend == "triton")
        """This engine's kernel dispatch, active around each of its forward passes."""
        if self.kernels.triton:
            self._select_decode_gemms(model_config.fused_silu_mul)
        if shard is not None and shard.custom_all_reduce and symmetric.wanted(self.device, shard.world_size):
            # With the Triton kernels, small batches also fuse the all-reduce into the next RMSNorm.
            p = shard.config
            shard.symmetric = symmetric.SymmetricAllReduce.create(
                self.dtype, self.device, hidden=self.arch.hidden_size if self.kernels.triton else 0,
                fused_rows=p.fused_all_reduce_rows, lamport=p.lamport_all_reduce, timeout_s=p.tp_timeout_s)
        max_len = min(model_config.max_model_len or self.arch.max_position_embeddings,
                      self.num_blocks * self.block_size)
        with kernels.active(self.kernels):
            self.graphs = maybe_build_graphs(self.model, self.kv_caches, self.device, model_config.enforce_eager,
                                             self.attention_backend, scheduler_config.max_num_seqs, max_len,
                                             self.block_size)
            self.mixed_graphs = maybe_build_mixed_graphs(
                self.model, self.kv_caches, model_config.mixed_cuda_graphs, self.graphs is not None,
                self.arch.num_experts > 0, shard is not None and shard.world_size > 1,
                scheduler_config.max_num_batched_tokens, scheduler_config.max_num_seqs, max_len, self.block_size)
        tokens = self.num_blocks * self.block_size
        logger.info("KV cache: %d blocks of %d tokens (%d tokens, %.2f GiB) on %s, %s; room for %.1f "
                    "sequences of %d tokens at once", self.num_blocks, self.block_size, tokens,
                    self.num_blocks * self.bytes_per_block / 2**30, self.device, self.kv_cache_dtype, tokens / max_len,
                    max_len)

    def _select_decode_gemms(self, fused_silu_mul: bool) -> None:
        """Time the Triton skinny GEMM against cuBLAS on this model's weights (before graph capture);
        with `fused_silu_mul`, the gate/up GEMM with SiLU·mul in its epilogue against the pair too."""
        from tritongen.ops import triton_gemv

        weights = [m.weight for m in self.model.modules() if isinstance(m, torch.nn.Linear)]
        made = self.kernels.gemm = triton_gemv.select_kernels(weights, agree=self._mean_over_ranks)
        logger.info("decode GEMMs: the Triton skinny kernel serves %d of %d (shape, rows) cases, cuBLAS the rest",
                    sum(c is not None for c in made.values()), len(made))
        gate_up = [m.gate_up_proj.weight for m in self.model.modules()
                   if isinstance(getattr(m, "gate_up_proj", None), torch.nn.Linear)]  # not FP8 layers
        if gate_up and fused_silu_mul:
            made = self.kernels.gated = triton_gemv.select_gated_kernels(gate_up, self.kernels.gemm,
                                                                         agree=self._mean_over_ranks)
            logger.info("gate/up GEMM with SiLU·mul fused: %d of %d (shape, rows) cases",
                        sum(c is not None for c in made.values()), len(made))
        fp8 = [m for m in self.model.modules() if isinstance(m, Fp8Linear)]
        if fp8:
            from tritongen.ops import triton_fp8

            made = triton_fp8.select_configs(fp8, self.dtype, agree=self._mean_over_ranks)
            tokens = sorted(f"{n}x{k} after {producer} at {rows} rows" for (n, k, _, producer, rows), (cfg, _)
                            in made.items() if cfg.get("QUANT"))
            logger.info("fp8 decode GEMMs: tilings chosen for %d (shape, rows) cases; quantized tokens in %d: %s",
                        len(made), len(tokens), ", ".join(tokens) or "none")

    def _mean_over_ranks(self, values: list[float]) -> list[float]:
        """The mean of each value over the tensor-parallel ranks (a collective: every rank calls it)."""
        world = self.shard.world_size if self.shard is not None else 1
        return [v / world for v in self._over_ranks(values, torch.float64, torch.distributed.ReduceOp.SUM)]

    def _over_ranks(self, values: list, dtype: torch.dtype, op) -> list:
        """`values` combined element by element over the tensor-parallel ranks with `op` (a
        collective); as they are without tensor parallelism."""
        if self.shard is None or self.shard.world_size == 1:
            return values
        t = torch.tensor(values, dtype=dtype, device=self.device)
        torch.distributed.all_reduce(t, op=op, group=self.shard.group)
        return t.tolist()

    @property
    def bytes_per_block(self) -> int:
        """KV bytes of one block over all layers, of this rank's heads (1 byte per element in fp8)."""
        elt = self.kv_cache_dtype.itemsize
        return self.arch.num_hidden_layers * elt * math.prod(self.model.kv_cache_shape(1, self.block_size))

    def _agree(self, num_blocks: int) -> int:
        """Every rank must hold the same number of blocks (the scheduler's): the smallest wins."""
        return self._over_ranks([num_blocks], torch.int64, torch.distributed.ReduceOp.MIN)[0]

    def _num_blocks_from_memory(self, cache: CacheConfig, sched: SchedulerConfig) -> int:
        if self.device.type != "cuda":
            return max(1, int(cache.kv_cache_memory_gb * (1 << 30)) // self.bytes_per_block)
        free, total = torch.cuda.mem_get_info(self.device)
        used_by_others = total - free - torch.cuda.memory_reserved(self.device)
        a = self.arch
        # Rough activation reserve for one step at the full token budget (refined by the GPU issue).
        elt = torch.empty((), dtype=self.dtype).element_size()
        act = sched.max_num_batched_tokens * (4 * a.hidden_size + 3 * a.intermediate_size) * elt
        act += sched.max_num_seqs * a.vocab_size * 4 * 3
        budget = total * cache.gpu_memory_utilization - used_by_others - torch.cuda.memory_allocated(self.device) - act
        num_blocks = int(budget) // self.bytes_per_block
        if num_blocks < 1:
            raise RuntimeError(f"no GPU memory left for the KV cache (budget {budget / 2**30:.2f} GiB); "
                               "raise --gpu-memory-utilization or use a smaller model")
        return num_blocks

    def _allocate_kv_cache(self, model_path: str) -> list[torch.Tensor]:
        """One cache tensor per layer in kv_cache_dtype; an fp8 one carries its layer's scales."""
        shape = self.model.kv_cache_shape(self.num_blocks, self.block_size)  # this rank's KV heads
        caches = [torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                  for _ in range(self.arch.num_hidden_layers)]
        if self.kv_cache_dtype != self.dtype:
            for cache, (k_scale, v_scale) in zip(caches, checkpoint_kv_scales(model_path, len(caches))):
                set_kv_cache_scales(cache, k_scale, v_scale)
        return caches

    def _to_device(self, data: list, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype)
        if self._pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def _prepare(self, sched: SchedulerOutput) -> _Batch:
        lay = step_layout(sched.seqs, self.block_size)
        prompts = mixed_prompt_seqs([s.num_new_tokens for s in sched.seqs])  # their own attention launch
        attn = AttentionMetadata(
            slot_mapping=self._to_device(lay.slot_mapping, torch.int64),
            query_start_loc=self._to_device(lay.query_start_loc, torch.int32),
            seq_lens=self._to_device(lay.seq_lens, torch.int32),
            block_tables=self._to_device(lay.block_tables, torch.int32),
            query_start_loc_cpu=lay.query_start_loc,
            seq_lens_cpu=lay.seq_lens,
            block_size=self.block_size,
            backend=self.attention_backend,
            prompt_seqs=self._to_device(prompts, torch.int32) if prompts else None,
        )
        return _Batch(self._to_device(lay.ids, torch.int64), self._to_device(lay.positions, torch.int64),
                      attn, self._to_device(lay.logits_rows, torch.int64))

    @property
    def mixed_graph_steps(self) -> int:
        """Steps replayed from a mixed-step CUDA graph so far (0 without them)."""
        return self.mixed_graphs.replays if self.mixed_graphs is not None else 0

    @property
    def asynchronous(self) -> bool:
        """Whether launch() returns before the device finishes (CUDA): the engine then prepares the
        next step while this one runs."""
        return self.device.type == "cuda"

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        return self.launch(sched)()

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput) -> Callable[[], ModelOutput]:
        """Queue the step on the device; the returned function waits for the sampled ids."""
        with kernels.active(self.kernels):
            return self._launch(sched)

    def _launch(self, sched: SchedulerOutput) -> Callable[[], ModelOutput]:
        if self.sampler is not None:
            self.sampler.drop(sched.finished_request_ids)
        if sched.is_empty:
            return lambda: ModelOutput(sampled_token_ids=[])
        previous = self._previous_ids(sched)
        if self.graphs is not None and self.graphs.can_run(sched.seqs):
            hidden = self.graphs.run(sched.seqs, previous)  # pure decode: every row samples, in order
            return self._sample(self.model.compute_logits(hidden), sched.seqs)
        tokens = self.mixed_graphs.bucket(sched.seqs) if self.mixed_graphs is not None else None
        if tokens is not None:
            hidden, rows = self.mixed_graphs.run(sched.seqs, tokens, previous)
            sampling = [s for s in sched.seqs if s.do_sample]
            if not sampling:
                return lambda: ModelOutput(sampled_token_ids=[])
            return self._sample(self.model.compute_logits(hidden[rows]), sampling)
        batch = self._prepare(sched)
        if previous is not None:  # the decode rows come first, one token each
            batch.input_ids[: previous.shape[0]].copy_(previous)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.attn)
        prompt_lps = None
        if any(s.params.prompt_logprobs is not None for s in sched.seqs):
            prompt_lps = self._prompt_logprobs(hidden, sched)
        sampling = [s for s in sched.seqs if s.do_sample]
        if not sampling:
            return lambda: ModelOutput(sampled_token_ids=[], prompt_logprobs=prompt_lps)
        result = self._sample(self.model.compute_logits(hidden[batch.logits_indices]), sampling)

        def finish() -> ModelOutput:
            out = result()
            out.prompt_logprobs = prompt_lps
            return out

        return finish

    def _previous_ids(self, sched: SchedulerOutput) -> Optional[torch.Tensor]:
        """The device ids the first seqs of an asynchronous step decode: rows `previous_rows` of
        what the previous step sampled. Only rank 0 samples; under tensor parallelism it
        broadcasts them to the other ranks."""
        rows = sched.previous_rows
        if not rows:
            return None
        n = sched.num_previous
        if self.sampler is None:
            ids = torch.empty(n, dtype=torch.int64, device=self.device)
        else:
            ids = self.sampler.last_token_ids
            if ids is None or ids.shape[0] != n:
                raise RuntimeError(f"asynchronous step expects {n} ids sampled by the previous step, "
                                   f"found {None if ids is None else ids.shape[0]}")
            ids = ids.to(torch.int64)
        if self.shard is not None and self.shard.world_size > 1:
            torch.distributed.broadcast(ids, src=0, group=self.shard.group)
        if rows == list(range(n)):
            return ids
        return ids.index_select(0, self._to_device(rows, torch.int64))

    supports_input_from_previous = True
    """Launches asynchronous steps (SchedulerOutput.input_from_previous)."""

    def _sample(self, logits: torch.Tensor, seqs: list) -> Callable[[], ModelOutput]:
        if self.sampler is None:  # a tensor-parallel worker: the logits were for the all_gather
            return lambda: ModelOutput(sampled_token_ids=[])
        sampled = self.sampler.sample_async(logits, seqs)

        def finish() -> ModelOutput:
            ids, logprobs = sampled()
            return ModelOutput(sampled_token_ids=ids, logprobs=logprobs)

        return finish

    def _prompt_logprobs(self, hidden: torch.Tensor, sched: SchedulerOutput) -> dict[str, list[TokenLogprob]]:
        """Logprobs of the next prompt token at every scheduled prompt position of the requests
        that ask (the row at position p predicts prompt token p+1)."""
        out: dict[str, list[TokenLogprob]] = {}
        row = 0
        for s in sched.seqs:
            first, row = row, row + s.num_new_tokens
            end = min(s.seq_len, len(s.prompt_token_ids) - 1)  # last position with a next prompt token
            if s.params.prompt_logprobs is None or s.start_pos >= end:
                continue
            targets = s.prompt_token_ids[s.start_pos + 1:end + 1]
            out[s.request_id] = self._score_rows(hidden[first:first + end - s.start_pos], targets,
                                                 s.params.prompt_logprobs)
        return out

    def _score_rows(self, hidden: torch.Tensor, targets: list[int], k: int) -> list[TokenLogprob]:
        # Slices of 256 rows bound the [rows, vocab] float32 temporaries.
        result: list[TokenLogprob] = []
        for i in range(0, len(targets), 256):
            logits = self.model.compute_logits(hidden[i:i + 256])[:, : self.arch.vocab_size].float()
            lp = torch.log_softmax(logits, dim=-1)
            tgt = torch.tensor(targets[i:i + 256], device=lp.device)
            chosen = lp.gather(1, tgt.unsqueeze(1)).squeeze(1).tolist()
            top_lp, top_ids = lp.topk(k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
            for t, c, tl, ti in zip(targets[i:i + 256], chosen, top_lp.tolist(), top_ids.tolist()):
                result.append(TokenLogprob(token_id=t, logprob=c, top=list(zip(ti, tl))))
        return result

    @property
    def model_arch(self) -> ModelArch:
        return self.arch
