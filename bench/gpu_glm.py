"""GLM-4.7-Flash and a GLM-5-shaped model on one GPU, through the product's engine.

Random-weight bf16 checkpoints written by `transformers` (`save_pretrained`, the tokenizer of
bench/gpu_prepare.py beside them), loaded with `Engine.load(dir, device="cuda")` as `docqa`
does (engine/gpu/glm.py `GlmCudaDecoder`), and timed:

(a) GLM-4.7-Flash shape (`glm4_moe_lite`, all 47 layers, the real config: hidden 2048, 20 heads,
    MLA kv_lora 512 / q_lora 768, 64 routed experts top-4 + 1 shared, 1536 per expert; the
    vocabulary is the tokenizer's): `docqa engine bench --context N` (`context_benchmark`:
    prefill s, decode ms/token, first token of a 64-token question) at 32K and 128K under the
    engine's sparse settings, what `ask --read-all` runs (routed attention on the MLA latent:
    sinks + top-k blocks + window); dense MLA (`attention="dense"`) at --dense-contexts (32K:
    cheap; 128K dense prefill is ~37 s); HF transformers (SDPA, same weights, in the same run, on
    the model object that wrote the checkpoint) at 32K, as ratios. HF at 128K only with
    --hf-contexts (the issue's figure for it is 19.0 s prefill, 283 ms/token). A check first,
    layer by layer (`attention_by_layer`, teacher-forced): routed attention with every block in
    budget is dense MLA, each against an fp32 reference. The logits' distance from dense MLA's is
    reported for the whole budget, the default budget, and dense MLA itself in other chunks
    (`routed_vs_dense`: bf16 rounding alone moves these random 47-layer MoE logits far).
(b) GLM-5 shape (`glm_moe_dsa`: hidden 6144, 64 heads, MLA 512/2048, indexer 32 x 128 heads with
    top-2048, every layer "full" as GLM-5's config says) reduced to a few layers (the first
    dense, 32 routed experts of GLM-5's width instead of 256: the per-token cost is the same top-8
    + shared, the checkpoint 10 GB instead of 60): per layer, decode ms and prefill s at 128K and
    1M with DSA (the model's own indexer + token-sparse MLA) and with dense MLA on the same
    weights, as ratios. Prefill up to --full-prefill-max tokens is timed whole; past it (1M: ~100 s
    per layer and mode) the cost of one chunk at the context's middle and at its end is timed on
    a cache filled with random latents, and the whole prefill estimated as (N / chunk) x the
    middle chunk (a chunk's cost is affine in its position) — labelled "_est".
(c) with --parts glm5-fp8: the same GLM-5 shape in FP8 as the official GLM-5 FP8 checkpoints
    store it (every linear layer's matrix e4m3 with a scale per 128 x 128 block, experts one
    matrix each; written here by quantising the random bf16 checkpoint, `quantize_blocks`), and
    the bf16 checkpoint it came from, each loaded and timed in this run (DSA at --fp8-contexts):
    decode ms/token, prefill s, weight GiB on the GPU, and FP8 / bf16 ratios.
(d) with --e2e: GLM-4.7-Flash through the CLI before (a)'s engine is loaded (bench/gpu.py's `e2e`:
    a ~128K-token document, `docqa ingest`, `docqa ask --read-all` twice, each a new process), then
    `engine bench` at the document's own length in the same run (`e2e_vs_bench`): the first call's
    document prefill over the bench's, the second call's first token (the document from the
    prefix cache), answer decode ms/token — issue 30's GLM targets.

Exits non-zero when a stage fails; prints JSON (and writes it with --json).

    python3 bench/gpu_glm.py --json /tmp/out/gpu_glm.json            (on the H200, ~6 min)
    python3 bench/gpu_glm.py --smoke   (the same code on the CPU at tiny sizes under the Triton
                                        interpreter: ~5 min on an idle core, mostly decode steps)
    python3 bench/gpu_glm.py --parts glm5-fp8 --json /tmp/out/gpu_glm_fp8.json   (FP8 vs bf16 only)
    python3 bench/gpu_glm.py --parts flash --e2e --contexts --dense-contexts --hf-contexts \
        --check-context 0 --json /tmp/out/gpu_glm_e2e.json          (ask --read-all vs engine bench only)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the kernels run in its interpreter on CPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu import FAILED, RESULTS, e2e, e2e_vs_bench, hf_measure, ratio, say, stage  # noqa: E402  (bench/gpu.py's)

FLASH = dict(hidden_size=2048, intermediate_size=10240, moe_intermediate_size=1536, num_hidden_layers=47,
             num_attention_heads=20, num_key_value_heads=20, n_shared_experts=1, n_routed_experts=64,
             routed_scaling_factor=1.8, kv_lora_rank=512, q_lora_rank=768, qk_rope_head_dim=64, v_head_dim=256,
             qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=4, norm_topk_prob=True,
             rms_norm_eps=1e-5, tie_word_embeddings=False)
GLM5 = dict(hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048, num_hidden_layers=4,
            num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1, n_routed_experts=32,
            routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=2048, qk_rope_head_dim=64, v_head_dim=256,
            qk_nope_head_dim=192, n_group=1, topk_group=1, num_experts_per_tok=8, norm_topk_prob=True,
            rms_norm_eps=1e-5, tie_word_embeddings=False, index_topk=2048, index_head_dim=128, index_n_heads=32,
            first_k_dense_replace=1)
# --smoke: the same code at sizes the Triton interpreter runs in minutes on a CPU
SMOKE_FLASH = dict(FLASH, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, kv_lora_rank=32, q_lora_rank=48,
                   qk_rope_head_dim=16, v_head_dim=20, qk_nope_head_dim=24)
SMOKE_GLM5 = dict(GLM5, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, kv_lora_rank=32, q_lora_rank=48,
                  qk_rope_head_dim=16, v_head_dim=20, qk_nope_head_dim=24, index_topk=24, index_head_dim=32,
                  index_n_heads=4)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tokenizer_vocab(tokenizer_dir: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size()


def smoke_tokenizer(path: Path) -> Path:
    """A byte-level BPE tokenizer (256 tokens + end-of-text) for --smoke: a head small enough
    for the interpreter, and no need for .gpu/tokenizer (bench/gpu_prepare.py)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE({ch: i for i, ch in enumerate(sorted(alphabet))}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>", "bos_token": None}))
    return path


def bench_setup(prog: str, smoke: bool, tokenizer: str | None):
    """What the GPU benches (this one, gpu_mtp.py) start with: the device (the CPU only with
    --smoke), noted in RESULTS, and the tokenizer folder (.gpu/tokenizer, or --smoke's
    byte-level one in a temporary folder, returned to be removed) -> (device, dir, tmp or None)."""
    from docqa.kernels.gpu import device_summary, has_cuda

    device = torch.device("cpu" if smoke or not has_cuda() else "cuda")
    if device.type == "cpu" and not smoke:
        sys.exit(f"{prog}: no CUDA device (use --smoke to run the same code on the CPU at tiny sizes)")
    RESULTS["device"], RESULTS["torch"], RESULTS["smoke"] = device_summary(), torch.__version__, smoke
    say(f"device: {RESULTS['device']}, torch {torch.__version__}{' (smoke: tiny shapes, Triton interpreter)' if smoke else ''}")
    tokenizer_dir, tmp = Path(tokenizer or ROOT / ".gpu" / "tokenizer"), None
    if smoke and not tokenizer:
        tmp = Path(tempfile.mkdtemp(prefix="docqa-bench-tok-"))
        tokenizer_dir = smoke_tokenizer(tmp / "tokenizer")
    if not (tokenizer_dir / "tokenizer.json").exists():
        sys.exit(f"{prog}: no tokenizer at {tokenizer_dir} (python3 bench/gpu_prepare.py makes it)")
    return device, tokenizer_dir, tmp


def work_dir(requested: str | None, need_bytes: int) -> Path:
    """Where checkpoints go: --work, else /dev/shm when it has room (the GLM-4.7-Flash checkpoint,
    ~58 GB, does not fit the H200 machine's 64 GiB disk beside everything else), else a temp dir."""
    if requested:
        return Path(requested)
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > need_bytes * 1.05:
        return Path(tempfile.mkdtemp(prefix="docqa-glm-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="docqa-glm-"))


def checkpoint_bytes(cfg: dict, vocab: int) -> int:
    """bf16 bytes of a GLM MLA + MoE checkpoint of this shape (for the room check)."""
    h, n_layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    attn = (h * cfg["q_lora_rank"] + cfg["q_lora_rank"] * heads * qk + h * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
            + cfg["kv_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]) + heads * cfg["v_head_dim"] * h)
    moe = 3 * h * cfg["moe_intermediate_size"] * (cfg["n_routed_experts"] + cfg["n_shared_experts"])
    dense = 3 * h * cfg["intermediate_size"]
    return 2 * (2 * vocab * h + n_layers * (attn + moe) + dense)


def hf_config(kind: str, shape: dict, vocab: int, max_pos: int):
    import transformers

    common = dict(shape, vocab_size=vocab, max_position_embeddings=max_pos, pad_token_id=None, bos_token_id=None,
                  eos_token_id=None)
    if kind == "flash":
        return transformers.Glm4MoeLiteConfig(**common)
    layers = shape["num_hidden_layers"]
    return transformers.GlmMoeDsaConfig(**common, indexer_types=["full"] * layers)


def write_checkpoint(kind: str, shape: dict, path: Path, tokenizer_dir: Path, device: torch.device, max_pos: int,
                     keep: bool = False):
    """Random weights written by transformers (built on the device in bf16; fp32 on the CPU), plus
    the tokenizer files. Returns the model when `keep` (HF's reference runs on it), else None."""
    import transformers

    vocab = tokenizer_vocab(tokenizer_dir)
    need = checkpoint_bytes(shape, vocab)
    free = shutil.disk_usage(path.parent).free
    if free < need * 1.05:
        raise RuntimeError(f"{path.parent} has {free / 2**30:.0f} GiB free, the checkpoint needs {need / 2**30:.0f} GiB "
                           "(pass --work DIR)")
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(hf_config(kind, shape, vocab, max_pos),
                                                                  attn_implementation="sdpa")
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    model.save_pretrained(path, max_shard_size="5GB")
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    say(f"   wrote {path} ({sum(f.stat().st_size for f in path.glob('*.safetensors')) / 2**30:.1f} GiB)")
    if keep:
        return model
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return None


def transformers_writes_glm5() -> bool:
    """Whether this transformers builds GLM-5 with an explicit `indexer_types` (5.24 does; the GPU
    image's may predate the class or the field)."""
    import inspect

    import transformers

    cls = getattr(transformers, "GlmMoeDsaConfig", None)
    return cls is not None and "indexer_types" in inspect.signature(cls.__init__).parameters


def write_glm5_by_hand(shape: dict, path: Path, tokenizer_dir: Path, device: torch.device, max_pos: int) -> None:
    """The GLM-5-shaped checkpoint without transformers' GlmMoeDsa classes (the GPU image's
    transformers may predate them): config.json as transformers writes it, and random tensors
    under the names and shapes of the engine's CPU model (engine/models/glm.py, HF names)."""
    from safetensors.torch import save_file

    from docqa.engine.config import ModelConfig
    from docqa.engine.models.glm import GlmModel

    vocab = tokenizer_vocab(tokenizer_dir)
    cfg = dict(shape, model_type="glm_moe_dsa", architectures=["GlmMoeDsaForCausalLM"], vocab_size=vocab,
               max_position_embeddings=max_pos, indexer_types=["full"] * shape["num_hidden_layers"],
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, head_dim=shape["qk_rope_head_dim"])
    with torch.device("meta"):
        names = {n: tuple(p.shape) for n, p in GlmModel(ModelConfig.from_hf(cfg)).named_parameters()}
    names["embed_tokens.weight"] = (vocab, shape["hidden_size"])
    path.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shard, size, k = {}, 0, 0
    for name, dims in names.items():
        t = torch.empty(dims, dtype=dtype, device=device)
        if name.endswith("bias"):
            t.zero_()
        elif "norm" in name:
            t.fill_(1.0)
        else:
            t.normal_(0.0, 0.02)
        shard["lm_head.weight" if name == "lm_head.weight" else "model." + name] = t.cpu()
        size += t.numel() * t.element_size()
        if size > 4 * 2**30:
            save_file(shard, str(path / f"model-{k:05d}.safetensors"))
            shard, size, k = {}, 0, k + 1
    if shard:
        save_file(shard, str(path / f"model-{k:05d}.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    say(f"   wrote {path} by hand ({sum(f.stat().st_size for f in path.glob('*.safetensors')) / 2**30:.1f} GiB)")


def load_engine(path: Path, device: torch.device):
    from docqa.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(path, device=str(device), kernels="triton")
    say(f"   loaded in {time.perf_counter() - t0:.1f} s: {type(engine.model).__name__}, {engine.dtype}")
    if type(engine.model).__name__ != "GlmCudaDecoder":
        raise RuntimeError(f"Engine.load built {type(engine.model).__name__}, not the CUDA GLM decoder")
    return engine


def dense_mla_state(engine, capacity: int, chunk: int):
    """The baseline DSA is measured against: the GLM-5 decoder attending densely over every
    cached latent — its state built for the same config without the indexer (so no indexer
    keys, and every layer attends on all rows), under dense settings."""
    import dataclasses

    from docqa.engine.gpu.glm import GlmCudaState

    config = dataclasses.replace(engine.config, dsa=None)
    return GlmCudaState(config, engine.sparse_settings(chunk_size=chunk, attention="dense"), capacity, engine.device)


@torch.inference_mode()
def layer_figures(engine, n: int, dsa: bool, *, chunk: int, full_max: int, steps: int) -> dict:
    """Per layer, one attention mode: prefill of n tokens (whole, or estimated from timed chunks
    past full_max) and graphed decode steps at position n."""
    from docqa.engine.benchmark import bench_prompt

    model, dev = engine.model, engine.device
    layers = engine.config.n_layers
    if dsa:
        state = model.new_state(n + chunk + 64, engine.sparse_settings(chunk_size=chunk))
    else:
        state = dense_mla_state(engine, n + chunk + 64, chunk)
    ids = torch.tensor(bench_prompt(engine.tokenizer, n), device=dev)
    model.prefill(ids[:min(n, chunk)], state, 0)  # compiles the kernels outside the timings
    out = {"context": n, "attention": "dsa" if dsa else "dense-mla", "chunk": chunk}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if n <= full_max:
        sync(dev)
        t0 = time.perf_counter()
        model.prefill(ids, state, 0)
        sync(dev)
        out["prefill_s"] = time.perf_counter() - t0
        out["prefill_s_per_layer"] = out["prefill_s"] / layers
    else:  # random latents (and indexer keys) stand in for the prefix; a chunk's cost is affine in its position
        state.kv[:, :n].normal_()
        state.ik[:, :n].normal_()
        for name, p0 in (("mid", n // 2 - chunk // 2), ("end", n - chunk)):
            sync(dev)
            t0 = time.perf_counter()
            model.prefill(ids[p0:p0 + chunk], state, p0)
            sync(dev)
            out[f"prefill_chunk_{name}_s"] = time.perf_counter() - t0
        out["prefill_s_est"] = n / chunk * out["prefill_chunk_mid_s"]
        out["prefill_s_per_layer_est"] = out["prefill_s_est"] / layers
    state.num_tokens = n
    g = model.capture_decode(state)
    for _ in range(3):
        g.reset(n, 1)
        g.step()
    g.reset(n, 1)
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        g.step()
    sync(dev)
    out["decode_step_ms"] = (time.perf_counter() - t0) / steps * 1e3
    out["decode_ms_per_layer"] = out["decode_step_ms"] / layers  # embedding and head included
    out["graphed"] = g.graph is not None
    if dev.type == "cuda":
        out["peak_gpu_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    del g, state
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


@torch.inference_mode()
def routed_vs_dense(engine, n: int, tail: int = 64) -> dict:
    """Logits of the last `tail` of n random tokens (prefilled in the engine's chunks) under dense
    MLA, routed attention with every block in budget, and the product's default budget; beside
    them dense MLA prefilled in chunks of half the size: the same model computed in another order,
    whose distance from dense is how far bf16 rounding alone carries these random weights (47
    layers of top-4-of-64 expert choices flip on near ties). Reported, not checked: the check of
    the routed kernel is `attention_by_layer` (teacher-forced, so rounding cannot compound)."""
    ids = torch.randint(0, engine.config.vocab, (n,), generator=torch.Generator().manual_seed(0)).to(engine.device)

    def logits(settings):
        state = engine.new_state(n + 8, settings)
        engine.model.prefill(ids[:-tail], state, 0)
        state.commit(n - tail)
        return engine.model.prefill(ids[-tail:], state, n - tail, all_logits=True).float()

    dense_settings = engine.sparse_settings(attention="dense")
    dense = logits(dense_settings)
    out = {"context": n, "tokens_compared": tail}
    for name, settings in (("dense_half_chunks", engine.sparse_settings(attention="dense",
                                                                       chunk_size=dense_settings.chunk_size // 2)),
                           ("whole_budget", engine.sparse_settings(top_k=1 << 20)),
                           ("default", engine.sparse_settings())):
        got = logits(settings)
        out[name] = {"cosine": torch.nn.functional.cosine_similarity(got.flatten(), dense.flatten(), dim=0).item(),
                     "max_abs": (got - dense).abs().max().item(), "logit_std": dense.std().item(),
                     "argmax_agree": (got.argmax(-1) == dense.argmax(-1)).float().mean().item()}
        say(f"   {name} vs dense MLA @ {n}: {out[name]}")
    return out


@torch.inference_mode()
def attention_by_layer(engine, n: int, tail: int = 64) -> dict:
    """Where routed and dense MLA part, layer by layer (teacher-forced: every layer gets the same
    hidden state, the one dense MLA gives). The same n random tokens as `routed_vs_dense`, in the
    same prefill calls and chunks; each layer's absorbed queries and stored latents are attended
    three ways: routed with every block in budget (the product's kernel, autotuned), dense MLA as
    the engine's dense state does (SDPA on keys and values expanded from the latent), and an fp32
    reference on the latent (causal softmax(q.lat) lat[:, :R], every key). Relative errors of the
    attention outputs (after W_UV) against the reference; for the worst layer, each tile config
    of both routed kernels (absorbed, and on expanded keys and values: the decoder picks one per
    call) forced, and where along the queries its error sits."""
    from docqa.kernels.linear.triton_fp8 import linear_add_mm
    from docqa.kernels.mla_sparse.triton_mla_routed import (
        ATTN_TILES,
        EXP_TILES,
        fused_mla_routed_attention,
        fused_mla_routed_attention_expanded,
        store_latent_descriptors,
    )

    m, dev = engine.model, engine.device
    settings = engine.sparse_settings(top_k=1 << 20)
    kv = engine.new_state(n + 8, settings)
    ids = torch.randint(0, engine.config.vocab, (n,), generator=torch.Generator().manual_seed(0)).to(dev)
    step = settings.chunk_size
    spans = [(a, min(n - tail, a + step)) for a in range(0, n - tail, step)] + [(n - tail, n)]

    def rel(x, ref):
        return ((x.float() - ref).norm() / ref.norm()).item()

    def out_fp32(ly, o_lat):
        return torch.bmm(o_lat.float().transpose(0, 1), ly.w_uv_t.float()).transpose(0, 1).reshape(o_lat.shape[0], -1)

    rows, worst = [], None
    for a, b in spans:
        x = m.embed[ids[a:b]]
        rot = m.rotation(torch.arange(a, b, device=dev))
        for i, ly in enumerate(m.layers):
            pa, pb = m._project(ly, x, decode=False)
            kv.kv[i, a:b] = m._latent(ly, pa, rot)
            store_latent_descriptors(kv.kv[i], kv.kmin[i], kv.kmax[i], kv.kmean[i], a, b, settings.block_size)
            q_nope, q_rot, q_abs = m._queries(ly, pb, rot)
            lat = kv.kv[i, :b].float()
            s = torch.einsum("thd,sd->hts", q_abs.float(), lat) * m.scale
            s.masked_fill_(torch.arange(b, device=dev)[None, None, :] > torch.arange(a, b, device=dev)[None, :, None],
                           float("-inf"))
            ref_lat = torch.einsum("hts,sr->thr", s.softmax(-1), lat[:, : m.r])
            del s
            ref = out_fp32(ly, ref_lat)
            routed = m._routed_prefill_attention(ly, q_nope, q_rot, q_abs, kv, i, a)
            dense = m._dense_prefill_attention(ly, q_nope, q_rot, kv, i, b)
            nb = -(-b // settings.block_size)
            head = b - a - settings.route_tail  # the call's queries routed by chunks (the rest: on their own)
            row = {"layer": i, "call": [a, b], "routed": rel(routed, ref), "dense": rel(dense, ref),
                   "expanded": m._expands(head, a, -(-head // settings.route_chunk) * nb, settings)}
            rows.append(row)
            if worst is None or row["routed"] > worst[0]["routed"]:
                diff, ref3 = (routed.float() - ref).view(b - a, -1, m.vd), ref.view(b - a, -1, m.vd)
                per_pos = (diff.norm(dim=(1, 2)) / ref3.norm(dim=(1, 2))).cpu()
                per_head = (diff.norm(dim=(0, 2)) / ref3.norm(dim=(0, 2))).cpu()
                tiles = {}
                every = torch.arange(nb, device=dev).expand(-(-(b - a) // settings.route_chunk), nb).contiguous()
                args = (a, every, settings.route_chunk, settings.block_size, settings.sink_tokens, settings.window)
                for tile in ATTN_TILES:
                    one = fused_mla_routed_attention(q_abs, kv.kv[i], *args, m.r, m.scale, tile=tile)
                    tiles[f"absorbed {tile}"] = rel(one, ref_lat)
                for tile in EXP_TILES:
                    one = fused_mla_routed_attention_expanded(q_nope, q_rot, kv.kv[i], ly.w_kv, *args, m.scale,
                                                              tile=tile)
                    tiles[f"expanded {tile}"] = rel(one, ref3)
                bad = torch.nonzero(per_pos > 10 * per_pos.median()).flatten()
                worst = (row, {"tiles_forced": tiles, "per_head": [round(v, 5) for v in per_head.tolist()],
                               "per_pos_median": per_pos.median().item(), "per_pos_max": per_pos.max().item(),
                               "positions_over_10x_median": (bad + a).tolist()[:64], "n_over": len(bad)})
            x = linear_add_mm(x, dense, ly.wo)
            if ly.bo is not None:
                x += ly.bo
            x = m._mlp(ly, x, decode=False)
    for r in rows:
        if r["routed"] > 2e-2 or r["dense"] > 2e-2 or r["layer"] in (0, len(m.layers) - 1):
            say(f"   layer {r['layer']:2d} tokens {r['call'][0]}..{r['call'][1]}: routed {r['routed']:.2e} "
                f"({'expanded' if r['expanded'] else 'absorbed'}), dense {r['dense']:.2e} (vs the fp32 reference)")
    say(f"   worst routed: {worst[0]} -> {worst[1]}")
    # routed and dense MLA round differently (bf16 probabilities times the latent vs SDPA on
    # expanded keys): each within bf16's error of the fp32 reference, and neither far worse
    bad = [r for r in rows if r["routed"] > max(2 * r["dense"], 5e-3)]
    if bad:
        raise RuntimeError(f"routed attention with every block in budget is not dense MLA in {len(bad)} "
                           f"layer-calls, e.g. {bad[0]}")
    return {"rows": rows, "worst": worst}


@torch.inference_mode()
def prefill_profile(engine, n: int, top: int = 25) -> dict:
    """Where a routed prefill chunk's GPU time goes at context n: the document prefilled, then its
    last chunk again under torch.profiler; CUDA time per kernel name (the top ones) and in all."""
    from torch.profiler import ProfilerActivity, profile

    from docqa.engine.benchmark import bench_prompt

    settings = engine.sparse_settings()
    ids = torch.tensor(bench_prompt(engine.tokenizer, n), device=engine.device)
    state = engine.new_state(n + 8, settings)
    engine.model.prefill(ids, state, 0)
    c = min(settings.chunk_size, n // 2)
    engine.model.prefill(ids[n - c:], state, n - c)  # warm: the same call as the profiled one
    sync(engine.device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        engine.model.prefill(ids[n - c:], state, n - c)
        sync(engine.device)
    wall = time.perf_counter() - t0
    per = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.key] = per.get(e.key, 0.0) + e.self_device_time_total / 1e3
    total = sum(per.values())
    ranked = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    say(f"   last {c}-token chunk at {n}: wall {wall * 1e3:.1f} ms (profiled), GPU kernels {total:.1f} ms")
    for name, ms in ranked:
        say(f"   {ms:8.2f} ms  {100 * ms / total:5.1f} %  {name[:110]}")
    out = {"context": n, "chunk": c, "wall_ms": wall * 1e3, "gpu_ms": total, "top": ranked, "host": {}}
    # the host's side: a call's wall time unprofiled, and where its Python time goes (cProfile);
    # a call whose wall exceeds its GPU kernels' time is bound by launching them
    for t in (c, 64):
        out["host"][t] = host_profile(lambda: engine.model.prefill(ids[n - t:], state, n - t), engine.device, top)
    return out


def host_profile(call, dev, top: int) -> dict:
    """`call`'s median wall ms (3 runs) and a cProfile of one more: the functions with the most
    time of their own."""
    import cProfile
    import pstats

    walls = []
    for _ in range(3):
        sync(dev)
        t0 = time.perf_counter()
        call()
        sync(dev)
        walls.append((time.perf_counter() - t0) * 1e3)
    prof = cProfile.Profile()
    sync(dev)
    prof.enable()
    call()
    sync(dev)
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(((v[2], v[3], v[1], f"{k[0].split('/')[-1]}:{k[1]} {k[2]}") for k, v in st.stats.items()),
                  reverse=True)[:top]
    wall = statistics.median(walls)
    say(f"   host: {wall:.1f} ms a call (median of 3); cProfile of one, own time / with callees / calls:")
    for own, cum, calls, name in rows:
        say(f"   {own * 1e3:8.2f} {cum * 1e3:8.2f} {calls:6d}  {name[:100]}")
    return {"wall_ms": wall, "top_own": [[round(o * 1e3, 2), round(cu * 1e3, 2), n, name] for o, cu, n, name in rows]}


def attention_tiles(n: int, tiles: list[tuple], chunk: int = 4096, reps: int = 5) -> dict:
    """The routed prefill attention kernels alone at GLM-4.7-Flash's attention dims (20 heads,
    latent 512 + rope 64; nope 192, v 256), the last `chunk` queries of an n-token context under
    the engine's sparse settings, random latents and blocks: ms per call and TFLOP/s (of each
    form's own work on the visible keys) for each tile (forced) and the autotuner's pick, in
    both forms (absorbed on the latent; expanded keys and values, the gather and GEMM included);
    each checked against its fp32 reference on the chunk's last 64 queries' rows."""
    from docqa.engine.generate import _sparse_settings
    from docqa.kernels.mla_sparse import (
        fused_mla_routed_attention,
        fused_mla_routed_attention_expanded,
        naive_mla_routed_attention,
        naive_mla_routed_attention_expanded,
    )
    from docqa.kernels.mla_sparse.naive import routed_token_mask
    from docqa.kernels.mla_sparse.triton_mla_routed import EXP_TILES

    s = _sparse_settings(torch.bfloat16)
    dev = torch.device("cuda")
    h, r, p, b = FLASH["num_attention_heads"], FLASH["kv_lora_rank"], FLASH["qk_rope_head_dim"], s.block_size
    n_nope, v = FLASH["qk_nope_head_dim"], FLASH["v_head_dim"]
    g = torch.Generator(device=dev).manual_seed(0)
    lat = torch.randn(n, r + p, device=dev, generator=g).to(torch.bfloat16)
    q = (torch.randn(chunk, h, r + p, device=dev, generator=g) * 0.05).to(torch.bfloat16)
    q0, rc = n - chunk, s.route_chunk
    n_c = -(-chunk // rc)
    last = torch.arange(1, n_c + 1, device=dev) * rc - 1 + q0
    cand = (last - s.window + b) // b  # blocks first .. cand-1 are each routing chunk's candidates
    first = s.sink_tokens // b
    blocks = torch.stack([first + torch.randperm(int(e) - first, device=dev, generator=g)[: s.top_k]
                          for e in cand.tolist()])
    scale = (FLASH["qk_nope_head_dim"] + p) ** -0.5
    seen = routed_token_mask(n, q0, chunk, blocks, rc, b, s.sink_tokens, s.window).sum().item()
    flop = 2 * h * seen * (r + p + r)
    tail = 64
    ref = naive_mla_routed_attention(q[-tail:].float(), lat.float(), n - tail, blocks[-1:], tail, b, s.sink_tokens,
                                     s.window, r, scale)
    # the expanded form: q = [q_nope W_UK | q_rot] above, keys and values from w_kv per head
    w_kv = (torch.randn(h, n_nope + v, r, device=dev, generator=g) * r ** -0.5).to(torch.bfloat16)
    q_nope = (torch.randn(chunk, h, n_nope, device=dev, generator=g) * 0.05).to(torch.bfloat16)
    q_rot = q[..., r:]
    ref_exp = naive_mla_routed_attention_expanded(q_nope[-tail:], q_rot[-tail:], lat, w_kv, n - tail, blocks[-1:],
                                                  tail, b, s.sink_tokens, s.window, scale).float()
    out = {"context": n, "chunk": chunk, "keys_per_query": seen / chunk, "tiles": {}}

    def absorbed(tile):
        return fused_mla_routed_attention(q, lat, q0, blocks, rc, b, s.sink_tokens, s.window, r, scale, tile=tile)

    def expanded(tile):
        return fused_mla_routed_attention_expanded(q_nope, q_rot, lat, w_kv, q0, blocks, rc, b, s.sink_tokens,
                                                   s.window, scale, tile=tile)

    runs = [("absorbed", tile, flop, ref, absorbed) for tile in [None, *tiles]]
    runs += [("expanded", tile, 2 * h * seen * (n_nope + p + v), ref_exp, expanded) for tile in [None, *EXP_TILES]]
    for form, tile, flop, ref, call in runs:
        name = f"{form} {'autotuned' if tile is None else tile}"
        try:
            run = lambda: call(tile)
            got = run()
            sync(dev)
            err = ((got[-tail:].float() - ref).norm() / ref.norm()).item()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                run()
                sync(dev)
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            out["tiles"][name] = {"ms": round(ms, 3), "tflops": round(flop / ms / 1e9, 1), "rel_err": err}
            say(f"   {name:37s} {ms:7.2f} ms  {flop / ms / 1e9:6.1f} TFLOP/s  err {err:.1e}")
        except Exception as e:  # a tile that does not fit (shared memory, registers) is a result too
            out["tiles"][name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            say(f"   {name:28s} failed: {type(e).__name__}: {str(e)[:120]}")
    return out


def dense_figures(engine, n: int, decode_tokens: int, question_tokens: int) -> dict:
    """Dense MLA (`attention="dense"`) on the same path as `context_benchmark`: prefill s of n
    tokens, then decode ms/token after a question (the graph captured by a first run)."""
    from docqa.engine.benchmark import bench_prompt
    from docqa.engine.generate import GREEDY_SYNC_EVERY

    dev = engine.device
    ids = bench_prompt(engine.tokenizer, n + question_tokens)
    state = engine.new_state(n + question_tokens + decode_tokens + 2 * GREEDY_SYNC_EVERY,
                             engine.sparse_settings(attention="dense"))
    engine.generate(ids[:min(n, 8192)], 4, state=state, stop_ids=())  # compiles outside the timings
    state.truncate(0)
    sync(dev)
    t0 = time.perf_counter()
    engine.prefill(ids[:n], state)
    sync(dev)
    out = {"context": n, "attention": "dense", "prefill_s": time.perf_counter() - t0}
    engine.generate(ids[n:], 2 * GREEDY_SYNC_EVERY, state=state, stop_ids=())  # captures the decode graph
    state.truncate(n)
    res = engine.generate(ids[n:], decode_tokens, state=state, stop_ids=())
    out["decode_ms"] = res.decode_s / max(len(res.token_ids) - 1, 1) * 1e3
    return out


def dump(path: str | None) -> None:
    """The results so far (after every stage: a run cut short by its time limit keeps them)."""
    if path:
        Path(path).write_text(json.dumps(RESULTS, indent=1, default=str))


def run_flash(a, device, tokenizer_dir, work) -> None:
    from docqa.engine.benchmark import context_benchmark

    r = RESULTS["glm4.7-flash"] = {"shape": dict(a.flash_shape)}
    ckpt = work / "glm4.7-flash"
    model = stage("flash: write checkpoint (transformers)", write_checkpoint, "flash", a.flash_shape, ckpt,
                  tokenizer_dir, device, max([*a.contexts, a.e2e_tokens if a.e2e else 0]) + 8192,
                  keep=bool(a.hf_contexts))
    if not (ckpt / "config.json").exists():
        return
    if model is not None:
        r["hf"] = stage("flash: HF transformers", hf_measure, model, a.hf_contexts, device)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    contexts, doc_n = list(a.contexts), 0
    if a.e2e:
        # before the engine is loaded here, as in bench/gpu.py: the first `docqa ask` meets this
        # machine's Triton cache as a user's would; the engine bench below is its reference
        r["e2e"] = stage("flash: e2e ingest + ask --read-all x2", e2e, ckpt, a.e2e_tokens, work, str(device),
                         retrieved=False, again=False, served=False)
        doc_n = int(((r["e2e"] or {"calls": [{}]})["calls"][0].get("timings") or {}).get("prefix_tokens", 0))
        if doc_n and doc_n not in contexts:
            contexts.append(doc_n)  # the bench at the document's own length: the same tokens prefilled
        dump(a.json)
    engine = stage("flash: Engine.load", load_engine, ckpt, device)
    if engine is None:
        return
    if a.check_context:
        r["routed_vs_dense"] = stage(f"flash: routed vs dense MLA logits @ {a.check_context}", routed_vs_dense,
                                     engine, a.check_context)
        r["attention_by_layer"] = stage(f"flash: attention by layer vs an fp32 reference @ {a.check_context}",
                                        attention_by_layer, engine, a.check_context)
    for n in a.dense_contexts:
        res = stage(f"flash: dense MLA @ {n}", dense_figures, engine, n, a.decode_tokens, a.question_tokens)
        r[f"dense_{n}"] = res
        if res:
            say(f"   dense MLA @ {n}: prefill {res['prefill_s']:.2f} s, decode {res['decode_ms']:.2f} ms/token")
        dump(a.json)
    for n in contexts:
        res = stage(f"flash: engine bench --context {n}", context_benchmark, engine, n,
                    question_tokens=a.question_tokens, decode_tokens=a.decode_tokens, say=say)
        r[f"bench_{n}"] = res
        if res:
            say(f"   {n}: prefill {res['prefill_s']:.2f} s, decode {res['decode_ms_per_token']:.2f} ms/token, "
                f"first token {res['first_token_s'] * 1e3:.1f} ms")
            dense = r.get(f"dense_{n}")
            if dense:
                r[f"sparse_vs_dense_{n}"] = {"prefill_speedup": ratio(dense["prefill_s"], res["prefill_s"]),
                                             "decode_speedup": ratio(dense["decode_ms"], res["decode_ms_per_token"])}
                say(f"   sparse vs dense MLA @ {n}: {r[f'sparse_vs_dense_{n}']}")
            hf = (r.get("hf") or {}).get(str(n)) or {}
            if "prefill_s" in hf:
                r[f"vs_hf_{n}"] = {"prefill_speedup": ratio(hf["prefill_s"], res["prefill_s"]),
                                   "decode_speedup": ratio(hf["decode_ms"], res["decode_ms_per_token"])}
                say(f"   vs HF @ {n}: {r[f'vs_hf_{n}']}")
        dump(a.json)
    if r.get("e2e") and r.get(f"bench_{doc_n}"):
        r["e2e_vs_bench"] = stage("flash: ask --read-all vs engine bench", e2e_vs_bench, r["e2e"], r[f"bench_{doc_n}"])
        dump(a.json)
    if a.profile_context:
        r["profile"] = stage(f"flash: profile of a prefill chunk @ {a.profile_context}", prefill_profile, engine,
                             a.profile_context)
    del engine
    shutil.rmtree(ckpt, ignore_errors=True)


def run_glm5(a, device, tokenizer_dir, work) -> None:
    r = RESULTS["glm5-shape"] = {"shape": dict(a.glm5_shape)}
    ckpt = work / "glm5-shape"
    if a.glm5_writer == "transformers" or (a.glm5_writer == "auto" and transformers_writes_glm5()):
        stage("glm5: write checkpoint (transformers)", write_checkpoint, "glm5", a.glm5_shape, ckpt, tokenizer_dir,
              device, max(a.dsa_contexts) + 8192)
    else:
        stage("glm5: write checkpoint (by hand)", write_glm5_by_hand, a.glm5_shape, ckpt, tokenizer_dir, device,
              max(a.dsa_contexts) + 8192)
    if not (ckpt / "config.json").exists():
        return
    engine = stage("glm5: Engine.load", load_engine, ckpt, device)
    if engine is None:
        return
    for n in a.dsa_contexts:
        for dsa in (True, False):
            mode = "dsa" if dsa else "dense-mla"
            res = stage(f"glm5: {mode} @ {n}", layer_figures, engine, n, dsa, chunk=a.chunk, full_max=a.full_prefill_max,
                        steps=a.decode_steps)
            r[f"{mode}_{n}"] = res
            dump(a.json)
            if res:
                pre = res.get("prefill_s_per_layer", res.get("prefill_s_per_layer_est"))
                est = "" if "prefill_s_per_layer" in res else " (estimated)"
                say(f"   {mode} @ {n}: per layer decode {res['decode_ms_per_layer']:.3f} ms, prefill {pre:.2f} s{est}")
        d, m = r.get(f"dsa_{n}"), r.get(f"dense-mla_{n}")
        if d and m:
            key = "prefill_s" if "prefill_s" in d else "prefill_s_est"
            r[f"dense_over_dsa_{n}"] = {"decode": ratio(m["decode_step_ms"], d["decode_step_ms"]),
                                        "prefill": ratio(m[key], d[key])}
            say(f"   dense MLA / DSA @ {n}: {r[f'dense_over_dsa_{n}']}")
    lo, hi = min(a.dsa_contexts), max(a.dsa_contexts)
    if r.get(f"dsa_{lo}") and r.get(f"dsa_{hi}") and lo != hi:
        r[f"dsa_decode_{hi}_over_{lo}"] = ratio(r[f"dsa_{hi}"]["decode_step_ms"], r[f"dsa_{lo}"]["decode_step_ms"])
        say(f"   DSA decode {hi} / {lo}: {r[f'dsa_decode_{hi}_over_{lo}']} (target <= 2)")
    del engine
    shutil.rmtree(ckpt, ignore_errors=True)


def write_fp8_checkpoint(src: Path, dst: Path, block: tuple[int, int], device: torch.device) -> None:
    """src's bf16 checkpoint in the official FP8 layout: each linear layer's matrix (`*proj.weight`,
    stacked experts split into one matrix per expert as the release stores them) as e4m3 plus
    `weight_scale_inv` per block; embeddings, norms, gate and the indexer's weights_proj as they are."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from docqa.engine.models.fp8 import quantize_blocks

    dst.mkdir(parents=True, exist_ok=True)
    for k, f in enumerate(sorted(src.glob("*.safetensors"))):
        out = {}
        with safe_open(str(f), framework="pt", device=str(device)) as sf:
            for name in sf.keys():
                t = sf.get_tensor(name)
                stacked = name.endswith(("experts.gate_up_proj", "experts.down_proj"))
                if stacked:  # [E, rows, cols] -> experts.{j}.{gate,up,down}_proj.weight
                    base = name.rsplit(".", 1)[0]
                    for j in range(t.shape[0]):
                        pieces = zip(("gate", "up"), t[j].chunk(2)) if name.endswith("gate_up_proj") else [("down", t[j])]
                        for kind, w in pieces:
                            w8, scale = quantize_blocks(w, block)
                            out[f"{base}.{j}.{kind}_proj.weight"] = w8.cpu()
                            out[f"{base}.{j}.{kind}_proj.weight_scale_inv"] = scale.cpu()
                elif name.endswith("proj.weight") and "weights_proj" not in name and t.dim() == 2:
                    w8, scale = quantize_blocks(t, block)
                    out[name], out[name + "_scale_inv"] = w8.cpu(), scale.cpu()
                else:
                    out[name] = t.cpu()
                del t
        save_file(out, str(dst / f"model-{k:05d}.safetensors"))
        del out
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "generation_config.json":
            shutil.copy(f, dst / f.name)
    say(f"   wrote {dst} ({sum(f.stat().st_size for f in dst.glob('*.safetensors')) / 2**30:.1f} GiB)")


def run_glm5_fp8(a, device, tokenizer_dir, work) -> None:
    """The GLM-5 shape, FP8 against its own bf16 weights, DSA, in one run."""
    r = RESULTS["glm5-fp8"] = {"shape": dict(a.glm5_shape), "block": [128, 128]}
    src, dst = work / "glm5-shape-bf16", work / "glm5-shape-fp8"
    if a.glm5_writer == "transformers" or (a.glm5_writer == "auto" and transformers_writes_glm5()):
        stage("glm5-fp8: write bf16 checkpoint (transformers)", write_checkpoint, "glm5", a.glm5_shape, src,
              tokenizer_dir, device, max(a.fp8_contexts) + 8192)
    else:
        stage("glm5-fp8: write bf16 checkpoint (by hand)", write_glm5_by_hand, a.glm5_shape, src, tokenizer_dir,
              device, max(a.fp8_contexts) + 8192)
    if not (src / "config.json").exists():
        return
    stage("glm5-fp8: quantise to FP8 (128 x 128 blocks)", write_fp8_checkpoint, src, dst, (128, 128), device)
    for name, path in (("fp8", dst), ("bf16", src)):
        if not (path / "config.json").exists():
            continue
        engine = stage(f"glm5-fp8: Engine.load {name}", load_engine, path, device)
        if engine is None:
            continue
        m = engine.model
        ends = sum(t.numel() * t.element_size() for t in {id(t): t for t in (m.embed, m.lm_head)}.values())
        r[f"{name}_weights_GiB"] = float(f"{m.nbytes() / 2**30:.4g}")
        # without embeddings and head (bf16 in both)
        r[f"{name}_layer_weights_GiB"] = float(f"{(m.nbytes() - ends) / 2**30:.4g}")
        say(f"   {name}: weights on the device {r[f'{name}_weights_GiB']} GiB, "
            f"{r[f'{name}_layer_weights_GiB']} GiB without embeddings and head")
        for n in a.fp8_contexts:
            res = stage(f"glm5-fp8: {name} dsa @ {n}", layer_figures, engine, n, True, chunk=a.chunk,
                        full_max=a.full_prefill_max, steps=a.decode_steps)
            r[f"{name}_{n}"] = res
            if res:
                pre = res.get("prefill_s", res.get("prefill_s_est"))
                say(f"   {name} @ {n}: decode {res['decode_step_ms']:.3f} ms/token, prefill {pre:.2f} s")
            dump(a.json)
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if r.get("fp8_weights_GiB") and r.get("bf16_weights_GiB"):
        r["weights_fp8_over_bf16"] = ratio(r["fp8_weights_GiB"], r["bf16_weights_GiB"])
        r["layer_weights_fp8_over_bf16"] = ratio(r["fp8_layer_weights_GiB"], r["bf16_layer_weights_GiB"])
    for n in a.fp8_contexts:
        f, b = r.get(f"fp8_{n}"), r.get(f"bf16_{n}")
        if f and b:
            key = "prefill_s" if "prefill_s" in f else "prefill_s_est"
            r[f"fp8_over_bf16_{n}"] = {"decode": ratio(f["decode_step_ms"], b["decode_step_ms"]),
                                       "prefill": ratio(f[key], b[key]), "weights": r.get("weights_fp8_over_bf16"),
                                       "layer_weights": r.get("layer_weights_fp8_over_bf16")}
            say(f"   FP8 / bf16 @ {n}: {r[f'fp8_over_bf16_{n}']}")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--parts", nargs="+", default=["flash", "glm5"], choices=["flash", "glm5", "glm5-fp8", "attention"],
                    help="glm5-fp8 (not by default): the GLM-5 shape in FP8 vs bf16; attention (not by default): "
                         "the routed prefill attention kernel alone at GLM-4.7-Flash's dims, per tile")
    ap.add_argument("--tiles", nargs="*", default=[],
                    help="extra (BLOCK_M,BLOCK_N,warps,stages) tiles for --parts attention, as 64,32,8,2")
    ap.add_argument("--contexts", type=int, nargs="*", default=[32768, 131072], help="GLM-4.7-Flash contexts")
    ap.add_argument("--e2e", action="store_true",
                    help="GLM-4.7-Flash through the CLI first (bench/gpu.py's e2e: a ~--e2e-tokens document, "
                         "`docqa ingest`, `docqa ask --read-all` twice), then `engine bench` at the document's "
                         "length: issue 30's ratios. With --smoke ~35 min on a shared CPU: the bench of the "
                         "document's ~1.8K byte-level tokens runs in the Triton interpreter")
    ap.add_argument("--e2e-tokens", type=int, default=128000)
    ap.add_argument("--dense-contexts", type=int, nargs="*", default=[32768],
                    help="GLM-4.7-Flash contexts also run with dense MLA (none: skip)")
    ap.add_argument("--check-context", type=int, default=8192,
                    help="context of the routed-vs-dense logits checks on the GLM-4.7-Flash shape (0: skip them)")
    ap.add_argument("--profile-context", type=int, default=0,
                    help="profile the last prefill chunk of a routed GLM-4.7-Flash prefill of this many tokens (0: no)")
    ap.add_argument("--hf-contexts", type=int, nargs="*", default=[32768],
                    help="HF transformers contexts on the GLM-4.7-Flash shape (none: skip HF)")
    ap.add_argument("--dsa-contexts", type=int, nargs="+", default=[131072, 1048576])
    ap.add_argument("--glm5-layers", type=int, default=4)
    ap.add_argument("--fp8-contexts", type=int, nargs="+", default=[131072], help="contexts of --parts glm5-fp8")
    ap.add_argument("--glm5-writer", default="auto", choices=["auto", "transformers", "by-hand"],
                    help="auto: transformers when its GlmMoeDsaConfig takes indexer_types, else by hand")
    ap.add_argument("--chunk", type=int, default=4096, help="prefill chunk of the GLM-5 per-layer figures")
    ap.add_argument("--full-prefill-max", type=int, default=131072,
                    help="GLM-5 contexts up to this are prefilled whole; longer ones estimated from timed chunks")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default=None,
                    help="default: .gpu/tokenizer (bench/gpu_prepare.py); with --smoke a 257-token byte-level one "
                         "(the real 49K-token head makes each interpreted decode step minutes)")
    ap.add_argument("--work", default=None, help="where checkpoints go (default: /dev/shm if it has room, else a temp dir)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    a.flash_shape, a.glm5_shape = dict(FLASH), dict(GLM5, num_hidden_layers=a.glm5_layers)
    if a.smoke:
        a.flash_shape, a.glm5_shape = dict(SMOKE_FLASH), dict(SMOKE_GLM5)
        a.contexts, a.hf_contexts, a.dsa_contexts, a.dense_contexts, a.check_context = [80], [80], [48, 96], [80], 80
        a.e2e_tokens = 200  # one article of the e2e document: ~1.3K tokens of the byte-level tokenizer
        a.fp8_contexts = [48]
        a.chunk, a.full_prefill_max, a.decode_steps, a.question_tokens, a.decode_tokens = 32, 48, 2, 8, 4
    device, tokenizer_dir, tmp = bench_setup("gpu_glm.py", a.smoke, a.tokenizer)
    vocab = tokenizer_vocab(tokenizer_dir)
    need = max(checkpoint_bytes(s, vocab) for s in (a.flash_shape, a.glm5_shape))
    work = work_dir(a.work, need)
    work.mkdir(parents=True, exist_ok=True)
    RESULTS["work"] = {"dir": str(work), "free_GiB": round(shutil.disk_usage(work).free / 2**30, 1),
                       "largest_checkpoint_GiB": round(need / 2**30, 1)}
    say(f"checkpoints go to {work} ({RESULTS['work']['free_GiB']} GiB free, the largest needs "
        f"{RESULTS['work']['largest_checkpoint_GiB']} GiB)")
    t0 = time.time()
    if "flash" in a.parts:
        run_flash(a, device, tokenizer_dir, work)
    if "glm5" in a.parts:
        run_glm5(a, device, tokenizer_dir, work)
    if "glm5-fp8" in a.parts:
        run_glm5_fp8(a, device, tokenizer_dir, work)
    if "attention" in a.parts and device.type == "cuda":
        from docqa.kernels.mla_sparse.triton_mla_routed import ATTN_TILES
        tiles = [*ATTN_TILES, *(tuple(int(v) for v in t.split(",")) for t in a.tiles)]
        for n in a.contexts:
            RESULTS[f"attention_{n}"] = stage(f"attention kernel @ {n}", attention_tiles, n, tiles)
    RESULTS["total_s"] = round(time.time() - t0, 1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(RESULTS, indent=1, default=str))
    dump(a.json)
    say(f"failed stages: {FAILED}" if FAILED else "all stages ok")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
