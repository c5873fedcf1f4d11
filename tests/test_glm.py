"""GLM architectures against HF transformers 5.24 on tiny random checkpoints: GLM-4 (dense,
interleaved partial RoPE, sandwich norms), GLM-4.5 (MoE with group-limited sigmoid gate, partial
RoPE, q/k norm), GLM-4.7-Flash (MLA + MoE), GLM-5 (MLA + DSA indexer with IndexShare + MoE).
fp32 logits within the existing engine tests' tolerance, for prefill in chunks and for
step-by-step decode; for GLM-5 the indexer's top-k is far smaller than the context, and the
token sets it selects must equal the reference's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from docqa.engine.checkpoint import load_model  # noqa: E402
from docqa.engine.mla_state import MLAKVState  # noqa: E402

pytestmark = pytest.mark.reference

VOCAB = 260
TOL = 1e-4  # as tests/test_engine_vs_hf.py for tiny models


def tiny_config(kind: str, **over):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=4096, rms_norm_eps=1e-5,
                  pad_token_id=0, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    moe = dict(moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3, n_group=4,
               topk_group=2, routed_scaling_factor=1.7, n_shared_experts=1)
    mla = dict(kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24,
               v_head_dim=20, num_key_value_heads=4)
    if kind == "glm4":
        cfg = transformers.Glm4Config(**common, num_key_value_heads=2, head_dim=32,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                       "partial_rotary_factor": 0.5})
    elif kind == "glm4_moe":
        cfg = transformers.Glm4MoeConfig(**common, **moe, num_key_value_heads=2, head_dim=32,
                                         use_qk_norm=True, first_k_dense_replace=1,
                                         rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                          "partial_rotary_factor": 0.5})
    elif kind == "glm4_moe_lite":
        cfg = transformers.Glm4MoeLiteConfig(**common, **moe, **mla,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    elif kind == "glm_moe_dsa":
        common["num_hidden_layers"] = 5
        cfg = transformers.GlmMoeDsaConfig(**common, **moe, **mla, index_topk=24, index_head_dim=32,
                                           index_n_heads=16, first_k_dense_replace=1,
                                           indexer_types=["full", "shared", "shared", "full", "shared"],
                                           rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    else:
        raise ValueError(kind)
    for k, v in over.items():
        setattr(cfg, k, v)
    return cfg


def make_tiny_glm(path, kind: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), dtype=torch.float32)
    with torch.no_grad():  # random norms, biases and gate biases so those paths really count
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.normal_(1.0 if "norm" in name and not name.endswith("bias") else 0.0, 0.2)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.3)
    model.eval()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", ["glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa"])
def test_tiny_glm_matches_hf(tmp_path, kind):
    ref = make_tiny_glm(tmp_path, kind)
    ours, ckpt = load_model(tmp_path)
    assert ckpt.config.arch == kind
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (96,))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    got = ours(ids, ours.new_state(), chunk_size=40)  # chunks: prefill after a stored prefix
    diff = (got - want).abs().max().item()
    assert diff < TOL, diff
    state = ours.new_state(capacity=8)
    ours(ids[:70], state)
    steps = torch.cat([ours(ids[i:i + 1], state) for i in range(70, 96)])
    assert (steps - want[70:]).abs().max().item() < TOL


def test_dsa_selects_the_reference_tokens_and_shares_them(tmp_path):
    """GLM-5's indexer picks, for every query of every "full" layer, the same top-k token set as
    transformers (prefill in chunks and decode steps); "shared" layers attend to exactly the set
    of the last full layer before them; and with top-k (24) far below the context (96) the
    choices matter: dense MLA over the same weights gives other logits."""
    ref = make_tiny_glm(tmp_path, "glm_moe_dsa")
    ours, ckpt = load_model(tmp_path)
    kinds = ckpt.config.dsa.indexer_types
    torch.manual_seed(2)
    ids = torch.randint(0, VOCAB, (96,))

    want_sets = {}
    hooks = [layer.self_attn.indexer.register_forward_hook(
        lambda mod, args, out, i=i: want_sets.__setitem__(i, out[0].long()))
        for i, layer in enumerate(ref.model.layers) if layer.self_attn.indexer is not None]
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    for h in hooks:
        h.remove()
    assert sorted(want_sets) == [i for i, k in enumerate(kinds) if k == "full"]

    state = ours.new_state()
    picked: dict[int, list] = {i: [] for i in range(len(kinds))}
    attend = state.attend

    def spy(layer, q, k, v, positions, *, scale, indices=None):
        picked[layer].append(indices)
        return attend(layer, q, k, v, positions, scale=scale, indices=indices)

    state.attend = spy
    got = torch.cat([ours(ids[:40], state, chunk_size=24), ours(ids[40:80], state, chunk_size=24)]
                    + [ours(ids[i:i + 1], state) for i in range(80, 96)])
    assert (got - want).abs().max().item() < TOL

    for layer, kind in enumerate(kinds):
        chunks = picked[layer]
        if kind == "shared":  # the very tensors of the full layer before it
            full = max(i for i in range(layer) if kinds[i] == "full")
            assert all(a is b for a, b in zip(chunks, picked[full]))
            continue
        sizes = [24, 16, 24, 16] + [1] * 16  # the chunks the three calls above ran
        assert len(chunks) == len(sizes)
        rows = []
        for sel, n in zip(chunks, sizes):  # None: no query had more than top-k tokens before it
            rows += [None] * n if sel is None else list(sel)
        checked = 0
        for p, sel in enumerate(rows):
            ref_set = {int(s) for s in want_sets[layer][p] if s <= p}
            mine = set(range(p + 1)) if sel is None else {int(s) for s in sel if s >= 0}
            assert mine == ref_set, (layer, p)
            checked += len(ref_set) < p + 1  # the query really left tokens out
        assert checked >= 60

    # A top-k above the context keeps every token: dense MLA on the same weights.
    cfg = dataclasses.replace(ckpt.config, dsa=dataclasses.replace(ckpt.config.dsa, topk=10_000))
    everything = ours(ids, MLAKVState(cfg, ours.rope))
    assert (everything - want).abs().max().item() > 100 * TOL


# -- GLM tokenizer, chat template and the Engine on a sharded checkpoint ---------------------

GLM_SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>",
                "<|observation|>", "<think>", "</think>"]
# The shape of GLM-4.5's template: a [gMASK]<sop> prefix, role tags without end-of-turn tokens,
# and an empty think block when thinking is switched off.
GLM_TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '\\n<think></think>' }}{% endif %}"
    "{% endif %}")


def write_glm_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE({ch: i for i, ch in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(GLM_SPECIALS)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}))
    (path / "chat_template.jinja").write_text(GLM_TEMPLATE)
    ids = {t: tok.token_to_id(t) for t in GLM_SPECIALS}
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [
        ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]}))
    return ids


def test_engine_runs_a_sharded_glm5_with_its_chat_template(tmp_path):
    """Engine.load on a GLM-5-shaped HF directory saved in several safetensors shards: the chat
    prompt encodes as transformers' apply_chat_template does, generation stops on the tokens
    generation_config names, and greedy tokens equal transformers' generate()."""
    from docqa.engine import Engine

    torch.manual_seed(0)
    cfg = tiny_config("glm_moe_dsa", index_topk=12, vocab_size=272)  # 256 bytes + specials
    ref = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ref.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    specials = write_glm_tokenizer(tmp_path)
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))

    engine = Engine.load(tmp_path, device="cpu")
    assert engine.config.arch == "glm_moe_dsa"
    ids = engine.chat_prompt("Which law governs this agreement?")
    want_ids = ref_tok.apply_chat_template([{"role": "user", "content": "Which law governs this agreement?"}],
                                           tokenize=True, add_generation_prompt=True,
                                           return_dict=False)
    assert ids == want_ids
    assert {specials["<|endoftext|>"], specials["<|user|>"]} <= set(engine.tokenizer.stop_ids)

    result = engine.generate(ids, 12, stop_ids=())
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
    assert result.token_ids == out[0, len(ids):].tolist()


def test_dsa_state_segments_spill_and_prefix_cache(tmp_path):
    """The MLA/DSA state keeps latents and indexer keys in the engine's segmented cache: with
    32-token segments, one live segment and the rest spilled to disk, and with a document
    prefix restored from the PrefixCache (files on disk, a new cache object as another process
    would have), logits still equal transformers'."""
    from docqa.engine.prefix_cache import PrefixCache
    from docqa.engine.settings import EngineSettings

    ref = make_tiny_glm(tmp_path / "model", "glm_moe_dsa")
    ours, ckpt = load_model(tmp_path / "model")
    torch.manual_seed(3)
    ids = torch.randint(0, VOCAB, (100,))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    settings = EngineSettings(segment_size=32, block_size=32, live_segments=1)

    spilled = MLAKVState(ckpt.config, ours.rope, settings=settings, spill_dir=tmp_path / "spill")
    got = ours(ids, spilled, chunk_size=20)
    assert spilled.cache.spills > 0 and spilled.cache.resident_segments() <= 2
    assert (got - want).abs().max().item() < TOL

    cache = PrefixCache.for_config(ckpt.config, "tiny", settings, ours.rope, cache_dir=tmp_path / "kv")
    doc = ids[:80].tolist()
    state, n = cache.get_state("doc", doc)
    assert n == 0
    ours(torch.tensor(doc), state, chunk_size=20)
    assert cache.save("doc", doc, state) == 2  # two full 32-token segments
    again = PrefixCache.for_config(ckpt.config, "tiny", settings, ours.rope, cache_dir=tmp_path / "kv")
    state, n = again.get_state("doc", ids.tolist())
    assert n == 64 and again.hits_disk == 2
    rest = ours(ids[64:], state, chunk_size=20)
    assert (rest - want[64:]).abs().max().item() < TOL
