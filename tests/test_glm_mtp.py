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
    # every verify forward yields its own token, plus the draft when accepted; the first token
    # comes from the prefill
    assert len(want) - 1 <= res.steps + res.accepted <= len(want)
    assert res.acceptance_length == pytest.approx(1 + res.accepted / res.steps)

    # Drafts forced right on every other step and wrong otherwise: both paths, same tokens.
    calls = []

    def draft(out):
        calls.append(1)
        nxt = want[len(out)] if len(out) < len(want) else 0
        return nxt if len(calls) % 2 else (nxt + 1) % VOCAB

    forced = speculative_generate(model, prompt, 40, draft=draft)
    assert forced.token_ids == want
    # right drafts are the odd calls: accepted, each giving two tokens; wrong ones one token
    assert forced.accepted == (forced.drafted + 1) // 2
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


@pytest.mark.parametrize("kind", ["glm4_moe", "glm_moe_dsa"])
def test_engine_generate_speculates_and_equals_transformers_greedy(tmp_path, kind):
    """Engine.generate on a checkpoint with an MTP layer drafts with it (acceptance reported),
    and its tokens are transformers' greedy decoding of the same weights, as with speculation
    off."""
    from docqa.engine import Engine
    from test_glm import write_glm_tokenizer

    ref = make_tiny_glm(tmp_path, kind)
    add_mtp_layer(tmp_path)
    write_glm_tokenizer(tmp_path)
    torch.manual_seed(7)
    prompt = torch.randint(2, VOCAB, (30,)).tolist()
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                            eos_token_id=None)[0, len(prompt):].tolist()
    engine = Engine.load(tmp_path, device="cpu")
    streamed = []
    res = engine.generate(prompt, 24, stop_ids=(), on_token=lambda tok, _d: streamed.append(tok))
    assert res.token_ids == want and streamed == want and res.stop_reason == "length"
    spec = res.speculative
    assert spec["steps"] > 0 and spec["drafted"] == spec["steps"]
    assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted"] / spec["steps"])
    assert len(want) - 1 <= spec["steps"] + spec["accepted"] <= len(want)

    engine.speculative = False  # the setting that turns it off: one token per forward
    plain = engine.generate(prompt, 24, stop_ids=())
    assert plain.token_ids == want and plain.speculative is None

    # a stop token ends it as plain decoding does (not kept)
    engine.speculative = True
    stopped = engine.generate(prompt, 24, stop_ids=(want[9],))
    assert stopped.token_ids == want[:want.index(want[9])] and stopped.stop_reason == "stop"


def test_engine_generate_cli_reports_acceptance(tmp_path):
    import json

    from typer.testing import CliRunner

    from docqa.app.cli import app
    from test_glm import write_glm_tokenizer

    make_tiny_glm(tmp_path, "glm4_moe")
    add_mtp_layer(tmp_path)
    write_glm_tokenizer(tmp_path)
    runs = []
    for flags in ((), ("--no-speculative",)):
        r = CliRunner().invoke(app, ["engine", "generate", "abc", "-n", "12", "--model", str(tmp_path), "--json", *flags])
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.stdout))
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    spec = runs[0]["speculative"]
    assert spec["acceptance_length"] == pytest.approx(1 + spec["accepted"] / spec["steps"])
    assert runs[1]["speculative"] is None


def test_engine_does_not_speculate_on_a_routed_sparse_state(tmp_path):
    """A GQA GLM on the CPU's routed state (sinks + top-k blocks + window, a budget far below the
    context): a verify forward of [token, draft] would route both queries together where two
    decode steps route one each (speculating there gave other tokens from the third on), so
    generation decodes one token per forward there and its tokens are plain greedy's; a dense
    state of the same engine still speculates."""
    from docqa.engine import Engine
    from test_glm import write_glm_tokenizer

    make_tiny_glm(tmp_path, "glm4_moe")
    add_mtp_layer(tmp_path)
    write_glm_tokenizer(tmp_path)
    engine = Engine.load(tmp_path, device="cpu")
    torch.manual_seed(7)
    prompt = torch.randint(2, VOCAB, (60,)).tolist()
    tight = engine.sparse_settings(window=8, top_k=2, block_size=4, sink_tokens=2, dense_below=0, route_chunk=8,
                                   route_tail=2)
    engine.speculative = False
    plain = engine.generate(prompt, 30, state=engine.new_state(128, tight), stop_ids=())
    engine.speculative = True
    res = engine.generate(prompt, 30, state=engine.new_state(128, tight), stop_ids=())
    assert res.speculative is None and res.token_ids == plain.token_ids
    assert engine.generate(prompt, 4, stop_ids=()).speculative is not None  # the dense state speculates
