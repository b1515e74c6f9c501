#!/usr/bin/env bash
# bench serve (sharegpt-like, 50 prompts, concurrency 8) against every frontend, one server at a
# time on this machine: Triton (gRPC stream, HTTP generate_stream, llm_bls) then the OpenAI server.
# Usage: bash benchmarks/bench_serve_all.sh [MODEL] [OUTDIR]
set -uo pipefail
MODEL=${1:-dummy:tiny-llama}; OUT=${2:-/tmp/bench_serve_all}; mkdir -p "$OUT"
BENCH="tritongen bench serve --dataset sharegpt-like --num-prompts 50 --concurrency 8 --seed 0 --no-progress"
wait_http() { for _ in $(seq 1 240); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; return 1; }

tritongen serve --frontend triton --model "$MODEL" --http-port 18000 --grpc-port 18001 --metrics-port 18002 \
  > "$OUT/triton_server.log" 2>&1 & TPID=$!
if wait_http http://127.0.0.1:18000/v2/health/ready; then
  $BENCH --target triton-grpc --url 127.0.0.1:18001 --out "$OUT/triton-grpc.json" | tee "$OUT/triton-grpc.txt"
  $BENCH --target triton-http --url http://127.0.0.1:18000 --out "$OUT/triton-http.json" | tee "$OUT/triton-http.txt"
  $BENCH --target triton-bls --url http://127.0.0.1:18000 --out "$OUT/triton-bls.json" | tee "$OUT/triton-bls.txt"
else echo "tritonserver did not become ready"; fi
kill -INT $TPID; wait $TPID

tritongen serve --frontend openai --model "$MODEL" --port 19000 > "$OUT/openai_server.log" 2>&1 & OPID=$!
if wait_http http://127.0.0.1:19000/health; then
  $BENCH --target openai --url http://127.0.0.1:19000 --out "$OUT/openai.json" | tee "$OUT/openai.txt"
else echo "openai server did not become ready"; fi
kill -INT $OPID; wait $OPID
