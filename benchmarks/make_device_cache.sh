#!/usr/bin/env bash
# Here (PyPI reachable), once per checkout: the tokenizers a device call carries, in ignored .gpu/
# (add `/.gpu/` to .git/info/exclude in a new checkout; never commit it).
#   .gpu/tokcache        TRITONGEN_CACHE there: every dummy preset's tokenizer (the converted real
#                        ones and the default model's, without its weights), ~38 MiB
#   .gpu/tok.tar.xz      the Llama-2 tokenizer for `--tokenizer .gpu/cache/llama2-tokenizer`, 0.35 MiB:
#                        unpack it there first (`tar xJf .gpu/tok.tar.xz -C .gpu/cache`); it fits
#                        beside a peer's 56 MiB part where tokcache does not
# ~5 min the first time (the llama-cpp-python sdist's GGUFs are converted), seconds after.
set -euo pipefail
cd "$(dirname "$0")/.."
export TRITONGEN_CACHE=$PWD/.gpu/tokcache
python3 -m tritongen.cli fetch-model --tokenizers
rm -rf "$TRITONGEN_CACHE/SmolLM2-135M-Instruct"  # the weights stay here: dummy presets need its tokenizer only
mkdir -p .gpu/cache
rm -rf .gpu/cache/llama2-tokenizer && cp -r "$TRITONGEN_CACHE/tokenizers/llama-spm" .gpu/cache/llama2-tokenizer
tar cJf .gpu/tok.tar.xz -C .gpu/cache llama2-tokenizer
du -sh .gpu/tokcache .gpu/tok.tar.xz
