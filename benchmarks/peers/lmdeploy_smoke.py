"""Check, on the GPU machine, that the carried LMDeploy generates with its PyTorch engine: a tiny
random Llama (head_dim 128, the 7B's) saved by transformers with a word-level tokenizer beside it,
run by lmdeploy.pipeline(..., backend_config=PytorchEngineConfig(...)), greedy, 8 tokens, eager (no
CUDA graphs: this checks the install, not the speed); once from text, once from token ids (the way
bench/peers.py's LmdeploySide feeds it). Prints the tokens. Run by install_lmdeploy.sh; PYTHONPATH
must reach the LMDeploy site.
"""
from __future__ import annotations

import sys
import tempfile
import time

VOCAB = 1024


def tiny_llama(path: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(path)


def main() -> int:
    from lmdeploy import GenerationConfig, PytorchEngineConfig, pipeline

    gen = GenerationConfig(max_new_tokens=8, min_new_tokens=8, do_sample=False, ignore_eos=True)
    with tempfile.TemporaryDirectory(prefix="lmdeploy-smoke-") as path:
        tiny_llama(path)
        t0 = time.monotonic()
        engine = PytorchEngineConfig(dtype="bfloat16", session_len=256, cache_max_entry_count=0.2, eager_mode=True,
                                     enable_prefix_caching=False)
        pipe = pipeline(path, backend_config=engine, log_level="WARNING")
        start_s = time.monotonic() - t0
        try:
            text = pipe.infer("w5 w9 w13 w17", gen, do_preprocess=False)
            req = {"session_id": pipe.session_mgr.get(), "messages": None, "input_ids": [1, 5, 9, 13, 17],
                   "gen_config": gen, "stream_response": False}
            by_ids = None
            for out in next(pipe._infer(iter([req]), multiplex=False)):
                by_ids = by_ids.extend(out) if by_ids else out
        finally:
            pipe.close()
    ids_text, ids_ids = list(text.token_ids), list(by_ids.token_ids)
    print(f"lmdeploy smoke: started in {start_s:.1f} s; from text {ids_text} ({text.finish_reason}); "
          f"from token ids {ids_ids} ({by_ids.finish_reason})")
    if len(ids_text) != 8 or len(ids_ids) != 8:
        print(f"lmdeploy smoke FAILED: {len(ids_text)} and {len(ids_ids)} tokens, expected 8", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
