"""MTP speculative decoding on tiny GLM checkpoints that carry an MTP layer (stored as GLM-4.5
and GLM-5 store it: `model.layers.{n_layers}.*`): the tokens equal plain greedy decoding, with
the MTP layer's drafts and with forced drafts that are accepted and rejected in turn (so the
verify-and-truncate path runs on the dense and on the MLA/DSA state); acceptance reported."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from docqa.engine.checkpoint import load_model  # noqa: E402
from docqa.engine.models.mtp import MTPLayer, speculative_generate  # noqa: E402
from test_glm import VOCAB, make_tiny_glm  # noqa: E402


def add_mtp_layer(path, seed: int = 5) -> None:
    """Write a random MTP layer beside the HF shards: the decoder block's tensors named as the
    last layer's, plus enorm / hnorm / eh_proj / shared_head and a copy of the embedding."""
    g = torch.Generator().manual_seed(seed)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        n = 1 + max(int(k.split(".")[2]) for k in names if k.startswith("model.layers."))
        # GLM-5's MTP layer runs its own indexer: copy the shapes of a layer that has one.
        with_index = [int(k.split(".")[2]) for k in names if ".self_attn.indexer." in k]
        src = max(with_index) if with_index else n - 1
        last = {k.replace(f"layers.{src}.", f"layers.{n - 1}.", 1): f.get_tensor(k)
                for k in names if k.startswith(f"model.layers.{src}.")}
        embed = f.get_tensor("model.embed_tokens.weight")
    hidden = embed.shape[1]
    out = {k.replace(f"layers.{n - 1}.", f"layers.{n}.", 1):
           (1 + 0.1 * torch.randn(v.shape, generator=g)) if "norm" in k and not k.endswith("bias")
           else 0.1 * torch.randn(v.shape, generator=g) for k, v in last.items()}
    p = f"model.layers.{n}."
    out[p + "enorm.weight"] = torch.ones(hidden)
    out[p + "hnorm.weight"] = torch.ones(hidden)
    out[p + "eh_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=g)
    out[p + "shared_head.norm.weight"] = torch.ones(hidden)
    out[p + "embed_tokens.weight"] = embed.clone()
    save_file(out, str(path / "model-mtp.safetensors"))


def greedy(model, ids, n):
    state = model.new_state()
    tok = int(model(torch.tensor(ids), state)[-1].argmax())
    out = [tok]
    while len(out) < n:
        out.append(int(model(torch.tensor([out[-1]]), state)[-1].argmax()))
    return out


@pytest.mark.parametrize("kind", ["glm4_moe", "glm_moe_dsa"])
def test_mtp_speculative_equals_greedy(tmp_path, kind):
    make_tiny_glm(tmp_path, kind)
    add_mtp_layer(tmp_path)
    model, _ = load_model(tmp_path)
    mtp = MTPLayer.from_model(model)
    torch.manual_seed(4)
    prompt = torch.randint(0, VOCAB, (30,)).tolist()  # DSA top-k 24: the indexer selects
    want = greedy(model, prompt, 40)

    res = speculative_generate(model, prompt, 40, mtp=mtp)
    assert res.token_ids == want
    assert res.steps > 0 and res.drafted == res.steps
    assert res.acceptance_length == pytest.approx(len(want) / res.steps)

    # Drafts forced right on every other step and wrong otherwise: both paths, same tokens.
    calls = []

    def draft(out):
        calls.append(1)
        nxt = want[len(out)] if len(out) < len(want) else 0
        return nxt if len(calls) % 2 else (nxt + 1) % VOCAB

    forced = speculative_generate(model, prompt, 40, draft=draft)
    assert forced.token_ids == want
    assert 0 < forced.accepted < forced.drafted
    assert 1.0 < forced.acceptance_length < 2.0


def test_mtp_stops_on_stop_token(tmp_path):
    make_tiny_glm(tmp_path, "glm4_moe")
    add_mtp_layer(tmp_path)
    model, _ = load_model(tmp_path)
    prompt = list(range(5, 25))
    want = greedy(model, prompt, 30)
    stop = want[7]
    cut = want[:want.index(stop)]
    res = speculative_generate(model, prompt, 30, stop_ids=[stop],
                               draft=lambda out: want[len(out)] if len(out) < len(want) else 0)
    assert res.token_ids == cut and res.stop_reason == "stop"


def test_checkpoint_without_mtp_layer_is_refused(tmp_path):
    make_tiny_glm(tmp_path, "glm4_moe")
    model, _ = load_model(tmp_path)
    with pytest.raises(ValueError, match="no MTP layer"):
        MTPLayer.from_model(model)
