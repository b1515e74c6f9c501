#!/usr/bin/env bash
# First run as a newcomer: README's commands, from a fresh clone, with the default model.
#
#   scripts/first_run.sh               clone this checkout to a temp dir, install it in a new venv, run
#   scripts/first_run.sh --no-install  run the same commands with this checkout and the active python
#
# Each step's output must be non-empty and say something sensible (greedy answers name Paris); the
# script stops at the first step that does not, and prints its output. Slow (a CPU install is ~1-2
# min, each server start ~1 min): a script for people and optional CI jobs, not part of pytest.
# Ports are README's: 8000-8002 (Triton) and 9000 (OpenAI server); they must be free.
set -euo pipefail

INSTALL=1
[[ "${1:-}" == "--no-install" ]] && INSTALL=0
SRC="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d -t tritongen-first-run.XXXXXX)"
SERVER_PID=""
PASSED=0

say() { printf '\n== %s\n' "$*"; }

fail() {
    printf 'FAILED: %s\n' "$1" >&2
    [[ -n "${2:-}" && -f "$2" ]] && { echo "--- output:" >&2; tail -n 40 "$2" >&2; }
    exit 1
}

stop_server() {
    [[ -z "$SERVER_PID" ]] && return 0
    kill -INT "$SERVER_PID" 2>/dev/null || true  # what Ctrl-C sends
    for _ in $(seq 1 90); do
        kill -0 "$SERVER_PID" 2>/dev/null || { SERVER_PID=""; return 0; }
        sleep 1
    done
    echo "server $SERVER_PID still running 90 s after SIGINT; killing it" >&2
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

cleanup() {
    stop_server
    echo "logs and outputs: $WORK"
}
trap cleanup EXIT

# check NAME PATTERNS CMD...: run CMD, keep its output, require it non-empty and every one of the
# ';;'-separated extended regexes in PATTERNS to match one of its lines.
check() {
    local name="$1" patterns="$2" out rc=0
    out="$WORK/$(echo "$1" | tr -c 'A-Za-z0-9\n' '_').out"
    shift 2
    say "$name: $*"
    "$@" >"$out" 2>&1 || rc=$?
    cat "$out"
    [[ $rc == 0 ]] || fail "$name exited with status $rc" "$out"
    [[ -s "$out" ]] || fail "$name printed nothing" "$out"
    local pattern
    while IFS= read -r pattern; do
        grep -Eq -- "$pattern" "$out" || fail "$name: no line of its output matches /$pattern/" "$out"
    done < <(printf '%s\n' "${patterns//;;/$'\n'}")
    PASSED=$((PASSED + 1))
}

# wait_ready URL LOG: poll URL until it answers 200, or the server exits, or 300 s pass.
wait_ready() {
    local url="$1" log="$2"
    for _ in $(seq 1 300); do
        curl -sf -o /dev/null "$url" && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || fail "server exited before it was ready" "$log"
        sleep 1
    done
    fail "server not ready at $url after 300 s" "$log"
}

if [[ $INSTALL == 1 ]]; then
    say "fresh clone and install (README: pip install -c constraints.txt torch==2.13.0 -e \".[triton]\"; clients: .[clients])"
    git clone -q "$SRC" "$WORK/tritongen"
    cd "$WORK/tritongen"
    python3 -m venv .venv
    . .venv/bin/activate
    python -m pip install -q --upgrade pip
    start=$SECONDS
    pip install -q -c constraints.txt torch==2.13.0 -e ".[triton,clients]" >"$WORK/install.log" 2>&1 || fail "install" "$WORK/install.log"
    echo "installed in $((SECONDS - start)) s"
else
    cd "$SRC"
fi
command -v tritongen >/dev/null || fail "tritongen is not on PATH (activate the venv, or run without --no-install)"

check "fetch-model" "SmolLM2-135M-Instruct" tritongen fetch-model
check "presets" "dummy:llama-2-13b-tp2-rank" tritongen presets
check "generate (chat)" "Paris" tritongen generate "What is the capital of France?" --max-tokens 16
check "generate --no-chat --stream" "Paris;;^\[finish_reason=" tritongen generate --no-chat --stream --max-tokens 8 "The capital of France is"

# -- Triton frontend ------------------------------------------------------------------------------
say "tritongen serve (Triton frontend) in the background"
tritongen serve >"$WORK/serve-triton.log" 2>&1 &
SERVER_PID=$!
wait_ready "http://127.0.0.1:8000/v2/health/ready" "$WORK/serve-triton.log"
echo "ready"
P="The capital of France is"
check "curl llm/generate" '"text_output": ?"[^"]*Paris' \
    curl -s localhost:8000/v2/models/llm/generate -d "{\"text_input\": \"$P\", \"max_tokens\": 16, \"temperature\": 0}"
check "curl llm/generate_stream" 'data: .*Paris' \
    curl -s localhost:8000/v2/models/llm/generate_stream -d "{\"text_input\": \"$P\", \"max_tokens\": 16, \"temperature\": 0, \"stream\": true}"
check "curl llm_bls/generate" '"text_output": ?"[^"]*Paris' \
    curl -s localhost:8000/v2/models/llm_bls/generate -d "{\"text_input\": \"$P\", \"parameters\": {\"max_tokens\": 16, \"temperature\": 0}}"
check "triton_stream_client.py" "Paris;;^TTFT: [0-9.]+ ms$" \
    python clients/python/triton_stream_client.py --url 127.0.0.1:8001 --max-tokens 16 "$P"
check "triton_http_client.py" "^generate \(.*Paris;;^infer \(.*Paris" \
    python clients/python/triton_http_client.py --url 127.0.0.1:8000 --max-tokens 16 "$P"
check "triton_async_client.py" "^request 7: .*Paris;;^8/8 requests" \
    python clients/python/triton_async_client.py --url 127.0.0.1:8001 -n 8 --model llm "$P"
if command -v java >/dev/null; then
    check "java triton-generate" "Paris" java clients/java/TritongenClient.java triton-generate --url http://127.0.0.1:8000
    check "java triton-stream" "Paris" java clients/java/TritongenClient.java triton-stream --url http://127.0.0.1:8000
else
    say "java not found: skipping the Java client"
fi
stop_server

# -- OpenAI frontend ------------------------------------------------------------------------------
say "tritongen serve --frontend openai in the background"
tritongen serve --frontend openai >"$WORK/serve-openai.log" 2>&1 &
SERVER_PID=$!
wait_ready "http://127.0.0.1:9000/health" "$WORK/serve-openai.log"
echo "ready"
check "curl /v1/chat/completions" '"content": ?"[^"]*Paris' \
    curl -s localhost:9000/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16, "temperature": 0}'
check "openai_client.py" "^completion: ' Paris;;chat stream: .*Paris;;^usage: prompt_tokens=" \
    python clients/python/openai_client.py --base-url http://127.0.0.1:9000/v1
if command -v java >/dev/null; then
    check "java openai-chat --stream" "Paris" \
        java clients/java/TritongenClient.java openai-chat --url http://127.0.0.1:9000 --stream
fi
stop_server
if grep -Eq "Unsupported upgrade request|No supported WebSocket library" "$WORK/serve-openai.log"; then
    fail "the OpenAI server warned about an upgrade request" "$WORK/serve-openai.log"
fi

say "all $PASSED checks passed"
