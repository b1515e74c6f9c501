"""fuse_projections(): same outputs, and the state dict still speaks HF names both ways."""
import pytest
import torch

from tritongen.models.loader import load_model
from tritongen.ops.attention import build_attention_metadata

CPU = torch.device("cpu")


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-llama-mha"])
def test_fused_model_matches_and_round_trips_hf_names(preset):
    plain, arch = load_model(f"dummy:{preset}", torch.float32, CPU)
    fused, _ = load_model(f"dummy:{preset}", torch.float32, CPU, seed=5)  # different weights first
    fused.fuse_projections()
    assert fused.model.layers[0].self_attn.qkv_proj is not None
    fused.load_state_dict(plain.state_dict())  # HF names into the fused model
    got, want = fused.state_dict(), plain.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], v) for k, v in want.items())
    ids, pos = torch.tensor([5, 6, 7, 8, 9, 10]), torch.arange(6)
    meta = build_attention_metadata([6], [6], [[1, 0]], 4)

    def kv():
        return [torch.zeros(2, 2, 4, arch.num_key_value_heads, arch.head_dim) for _ in range(arch.num_hidden_layers)]

    with torch.no_grad():
        torch.testing.assert_close(fused(ids, pos, kv(), meta), plain(ids, pos, kv(), meta), atol=1e-5, rtol=1e-5)
