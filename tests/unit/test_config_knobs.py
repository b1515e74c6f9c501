"""Every engine knob is a config field with its help, a CLI flag, a Triton parameter and a README
entry; and the engine's code reads no TRITONGEN_* environment variable to tune itself."""
from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

from tritongen.config import ENGINE_CONFIG_PARTS, EngineConfig, ParallelConfig
from tritongen.config_cli import add_engine_args, engine_kwargs, field_docs

ROOT = Path(__file__).resolve().parents[2]
FIELDS = [(cls, f) for _, cls in ENGINE_CONFIG_PARTS for f in fields(cls)]


def test_every_field_has_help_a_flag_and_a_round_trip() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    helps = {a.dest: a.help for a in p._actions}
    for cls, f in FIELDS:
        assert field_docs(cls).get(f.name), f"{cls.__name__}.{f.name} has no docstring (its CLI help)"
        assert helps.get(f.name) == field_docs(cls)[f.name]
    args = p.parse_args(["--no-fused-silu-mul", "--lamport-all-reduce", "--fused-all-reduce-rows", "0",
                         "--tp-timeout-s", "5", "--log-level", "DEBUG", "--disable-custom-all-reduce"])
    config = EngineConfig.from_kwargs(**engine_kwargs(args))
    assert config.model.fused_silu_mul is False
    assert config.parallel == ParallelConfig(disable_custom_all_reduce=True, fused_all_reduce_rows=0,
                                             lamport_all_reduce=True, tp_timeout_s=5.0, log_level="DEBUG")
    assert EngineConfig.from_kwargs(**engine_kwargs(p.parse_args([]))) == EngineConfig()


def test_every_field_is_a_triton_parameter() -> None:
    from tritongen.triton.repo import engine_kwargs_from_config, engine_parameters

    options = {"fused_silu_mul": False, "lamport_all_reduce": True, "fused_all_reduce_rows": 64,
               "tp_timeout_s": 30.0, "log_level": "INFO"}
    params = {k: {"string_value": v} for k, v in engine_parameters(options).items()}
    assert engine_kwargs_from_config(params) == options
    assert set(engine_parameters({f.name: f.default for _, f in FIELDS if f.default is not None})) <= \
        {f.name for _, f in FIELDS}


def test_readme_lists_every_engine_option() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("Engine options (keyword arguments"):readme.index("## Command line")]
    missing = [f.name for _, f in FIELDS if f"`{f.name}`" not in section]
    assert not missing, f"README's engine options do not mention {missing}"


def test_no_engine_knob_is_read_from_the_environment() -> None:
    """TRITONGEN_* variables are for tools and locations (the model cache, a test server's paths,
    the bench's stream count), never read on the engine's path (core, models, ops, parallel, runner,
    entrypoints)."""
    pattern = re.compile(r"environ(?:\.get)?\s*[\[(]\s*[\"']TRITONGEN_|getenv\(\s*[\"']TRITONGEN_")
    engine = [p for pkg in ("core", "models", "ops", "parallel", "runner", "entrypoints")
              for p in (ROOT / "src" / "tritongen" / pkg).rglob("*.py")]
    hits = [f"{p.relative_to(ROOT)}" for p in engine if pattern.search(p.read_text())]
    assert not hits, f"engine code reads TRITONGEN_* environment variables: {hits}"
