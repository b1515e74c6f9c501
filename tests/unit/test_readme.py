"""README.md stays in step with the code it describes."""
import re
from pathlib import Path

from tritongen.models.presets import PRESETS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_dummy_preset_is_named_in_the_readme():
    text = README.read_text()
    named = set(re.findall(r"[\w.-]+", text))
    missing = [name for name in PRESETS if name not in named]
    assert not missing, f"README.md does not name the dummy presets {missing}"
