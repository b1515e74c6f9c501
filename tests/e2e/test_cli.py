"""The tritongen command line, run as a user would (a subprocess)."""
import os
import subprocess
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def tritongen(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-m", "tritongen.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_generate_streams_text_and_reports_usage():
    r = tritongen("generate", "Hello", "--model", "dummy:tiny-llama", "--max-tokens", "5", "--stream",
                  "--no-chat", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "finish_reason=length" in r.stderr and "completion_tokens=5" in r.stderr
    assert r.stdout.strip()


def test_unknown_model_path_is_a_clear_error():
    r = tritongen("generate", "Hello", "--model", "/no/such/model")
    assert r.returncode == 2
    assert "/no/such/model" in r.stderr and "Traceback" not in r.stderr


def test_unknown_preset_lists_presets():
    r = tritongen("generate", "Hello", "--model", "dummy:nope")
    assert r.returncode == 2 and "tiny-llama" in r.stderr and "Traceback" not in r.stderr


def test_bad_sampling_value_is_a_clear_error():
    r = tritongen("generate", "Hello", "--model", "dummy:tiny-llama", "--top-p", "0", "--device", "cpu")
    assert r.returncode == 2 and "top_p" in r.stderr and "Traceback" not in r.stderr


def test_tensor_parallel_size_reaches_every_engine_command():
    from tritongen.cli import build_parser

    parser = build_parser()
    commands = {"generate": ["x"], "serve": [], "repo": ["--out", "r"], "bench offline": [], "eval parity": []}
    for command, extra in commands.items():
        args = parser.parse_args([*command.split(), *extra, "--tensor-parallel-size", "2"])
        assert args.tensor_parallel_size == 2, command


def test_generate_with_two_tensor_parallel_ranks_matches_one():
    outs = []
    for tp in ("1", "2"):
        r = tritongen("generate", "Hello", "--model", "dummy:tiny-llama", "--max-tokens", "6", "--no-chat",
                      "--device", "cpu", "--num-blocks", "64", "--tensor-parallel-size", tp)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] and outs[0].strip()


def test_impossible_tensor_parallel_size_is_a_clear_error():
    r = tritongen("generate", "Hello", "--model", "dummy:tiny-llama", "--device", "cpu",
                  "--tensor-parallel-size", "3")
    assert r.returncode == 2 and "not divisible by tensor parallel world_size 3" in r.stderr
    assert "Traceback" not in r.stderr


def test_stream_trailer_is_on_its_own_line():
    # Both streams on one pipe, as in a terminal or `2>&1 | tee`.
    env = dict(os.environ, PYTHONPATH=SRC)
    r = subprocess.run([sys.executable, "-m", "tritongen.cli", "generate", "Hello", "--model", "dummy:tiny-llama",
                        "--max-tokens", "5", "--stream", "--no-chat", "--device", "cpu"], env=env, timeout=300,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout
    answer, trailer = r.stdout.rsplit("\n[finish_reason=", 1)
    assert answer.strip() and "[finish_reason=" not in answer, r.stdout
    assert trailer.endswith("completion_tokens=5]\n"), r.stdout


def test_model_too_big_for_memory_is_refused_before_loading():
    # 100 TB of KV cache fits no machine; the refusal says what would.
    r = tritongen("generate", "Hello", "--model", "dummy:tiny-llama", "--device", "cpu",
                  "--kv-cache-memory-gb", "100000", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "refusing to load it rather than run out of memory" in r.stderr
    assert "--kv-cache-memory-gb" in r.stderr and "for the KV cache" in r.stderr


def test_presets_are_listed_from_the_code():
    from tritongen.models.presets import PRESETS

    listing = tritongen("presets", timeout=60)
    help_text = tritongen("generate", "--help", timeout=60)
    assert listing.returncode == 0 and help_text.returncode == 0
    for name in PRESETS:
        assert f"dummy:{name} " in listing.stdout and name in help_text.stdout.replace("\n", " "), name
    assert "6.738B params" in listing.stdout  # llama-2-7b
