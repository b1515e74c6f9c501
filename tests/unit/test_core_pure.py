import subprocess
import sys


def test_core_never_imports_torch():
    code = (
        "import sys\n"
        "import tritongen, tritongen.types, tritongen.config\n"
        "import tritongen.core.engine, tritongen.core.scheduler, tritongen.core.block_manager\n"
        "import tritongen.core.detokenizer, tritongen.core.sequence\n"
        "from tritongen import SamplingParams\n"
        "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    import os
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = dict(os.environ, PYTHONPATH=src)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
