"""FP8 block-scaled checkpoints (e4m3 + `weight_scale_inv` per block, as the GLM-4.5 / GLM-5 FP8
releases store them) on the Llama family's CUDA decoder (engine/gpu/model.py `CudaDecoder`):
llama, glm4 and glm4_moe. The matrices stay e4m3 on the device and run through the FP8 kernels
(kernels/linear/triton_fp8.py, kernels/moe/triton_moe_fp8.py); the logits equal HF transformers
5.24's on the dequantised weights (fp32 activations: the FP8 kernels' exact mode).

Without a GPU the decoder runs on CPU tensors under TRITON_INTERPRET=1 (`kernels="triton"`);
the costlier interpreter run (glm4_moe) is -m slow on the CPU and runs by default on a GPU."""

from __future__ import annotations

import functools

import pytest
import torch

from docqa.kernels.gpu import has_cuda, has_triton, interpreting

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from test_cuda_glm import write_fp8_glm  # noqa: E402
from test_cuda_glm4 import prefill_then_decode_match_hf  # noqa: E402
from test_engine_vs_hf import make_tiny_hf_dir, write_tiny_tokenizer  # noqa: E402
from test_glm import VOCAB, make_tiny_glm  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("few_moe_configs")]
triton_runs = pytest.mark.skipif(not has_triton() or not (has_cuda() or interpreting()),
                                 reason="needs triton and either CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if has_cuda() else "cpu"
TOL = 1e-3 if has_cuda() else 1e-4  # as tests/test_cuda_glm4.py: the attention kernels' fp32 dots run in TF32 on a GPU
SLOW_ON_CPU = [] if has_cuda() else [pytest.mark.slow]
# 24-row blocks: off every head (16 dims for llama, 32 for GLM) and off the q / k / v and gate / up
# boundaries, so fusing rows and GLM's q/k row order (`rope_halves_order`) mix rows of different
# checkpoint blocks in one head; 32 columns: the FP8 kernels' column block
BLOCK = (24, 32)
MAKE = {
    "llama": make_tiny_hf_dir,
    "glm4": make_tiny_glm,
    # GLM-4.5/4.6: q/k/v biases (plain beside the FP8 rows) and, here, q/k norms too
    "glm4_moe": functools.partial(make_tiny_glm, attention_bias=True),
}


def rows_of_varied_scale(path, kind: str):
    """MAKE[kind]'s model with each projection row scaled by e^u, u uniform in [-1, 1]: neighbouring
    checkpoint blocks get scales up to ~7x apart, so a row moved without its scale shows."""
    model = MAKE[kind](path, kind)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight") or name.endswith("_proj"):  # experts: [E, rows, cols]
                p.mul_(torch.rand(*p.shape[:-1], 1, generator=g).mul(2).sub(1).exp())
    return model


def write_fp8(tmp_path, kind: str):
    """(HF's model on the dequantised weights, the FP8 checkpoint's directory with a tokenizer)."""
    ref, path = write_fp8_glm(tmp_path, kind, block=BLOCK, make=rows_of_varied_scale)
    write_tiny_tokenizer(path)
    write_tiny_tokenizer(tmp_path / "deq")
    return ref, path


def matrices(w) -> list:
    """Every projection matrix a `CudaWeights` holds, experts included."""
    out = [*w.wqkv, *w.wo, *(m for m in w.w13 + w.w2 if m is not None)]
    for moe in (m for m in w.moe if m is not None):
        out += [moe.w13, moe.w2]
    return out


def close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    diff = (got.float().cpu() - want.float().cpu()).abs().max().item()
    assert diff < TOL, (what, diff)


def test_fp8_llama_on_the_cpu_matches_hf_on_dequantised_weights(tmp_path):
    """The PyTorch path dequantises an FP8 Llama checkpoint at load."""
    from docqa.engine.checkpoint import load_model
    from docqa.engine.dense import DenseKVState

    ref, path = write_fp8(tmp_path, "llama")
    ours, ckpt = load_model(path)
    assert ckpt.config.fp8_block == BLOCK
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids[None]).logits[0]
    assert (ours(ids, DenseKVState(ckpt.config)) - want).abs().max().item() < 1e-4


@triton_runs
@pytest.mark.parametrize("kind", ["llama", *(pytest.param(k, marks=SLOW_ON_CPU) for k in ("glm4", "glm4_moe"))])
def test_fp8_checkpoint_on_cuda_decoder_matches_hf_on_dequantised_weights(tmp_path, kind):
    """Engine.load on the CUDA path: every matrix an e4m3 `Fp8Weight` (experts and the shared
    expert stacked), prefill in two calls (the second after a stored prefix) and decode steps
    (RoPE and the KV append in one launch after `fp8_gemv`; the CUDA graph on a GPU) give HF's
    logits."""
    from docqa.engine import Engine
    from docqa.kernels.linear.naive_fp8 import FP8, Fp8Weight

    ref, path = write_fp8(tmp_path, kind)
    engine = Engine.load(path, device=DEV, kernels="triton", dtype=torch.float32)
    model = engine.model
    assert type(model).__name__ == "CudaDecoder" and model.config.fp8_block == BLOCK
    assert not model.fold_qkv
    for m in matrices(model.w):
        assert isinstance(m, Fp8Weight) and m.w.dtype == FP8
    if kind == "glm4_moe":
        assert model.w.moe[1].w13.w.shape[0] == 9  # 8 routed experts and the shared one
    ids = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    prefill_then_decode_match_hf(engine, ref, ids, close)


@triton_runs
@pytest.mark.parametrize("kind", ["llama", "glm4_moe"])
def test_fp8_weights_stay_one_byte_in_bf16(tmp_path, kind):
    """In bf16 the FP8 decoder's matrices take ~1 byte per weight (+ an fp32 scale per 32
    columns), about half of what the bf16 decoder on the dequantised checkpoint holds; on a GPU
    its logits (FP8 tensor-core dots with activations quantised per token and 32 columns in
    prefill, e4m3 GEMVs at decode) are within e4m3's error of that decoder's."""
    from docqa.engine import Engine

    ref, path = write_fp8(tmp_path, kind)
    fp8 = Engine.load(path, device=DEV, kernels="triton", dtype=torch.bfloat16)
    bf16 = Engine.load(tmp_path / "deq", device=DEV, kernels="triton", dtype=torch.bfloat16)
    # everything but the matrices (embeddings, head, norms, biases, MoE gate) is the same bf16 in both
    weights = sum(m.numel() for m in ref.state_dict().values() if m.dim() >= 2) - 2 * VOCAB * ref.config.hidden_size
    gate = sum(m.numel() for n, m in ref.state_dict().items() if n.endswith("mlp.gate.weight"))
    bf16_matrices = 2 * (weights - gate)
    assert bf16_matrices == sum(2 * m.numel() for m in matrices(bf16.model.w))
    fp8_matrices = bf16_matrices + fp8.model.w.nbytes() - bf16.model.w.nbytes()
    ratio = fp8_matrices / bf16_matrices
    assert 0.5 < ratio < 0.6, ratio  # 1 byte + 4 / 32 for the scales, of 2 bytes
    if not has_cuda():  # the interpreter rounds fp32 -> e4m3 wrongly on carries (tests/test_kernel_fp8.py)
        return
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(12)).tolist()
    outs = []
    for engine in (fp8, bf16):
        state = engine.new_state(64)
        logits = engine.prefill(ids[:-4], state, all_logits=True).float().cpu()
        seen = []
        engine.generate(ids[-4:-3], 3, state=state, stop_ids=(),
                        choose=lambda lg, out: seen.append(lg.float().cpu().clone()) or ids[-3 + len(out)])
        outs.append(torch.cat([logits, torch.stack(seen)]))
    err = ((outs[0] - outs[1]).norm() / outs[1].norm()).item()
    assert err < 0.1, err  # e4m3 activations: ~2^-5 relative per element; a wrong scale would be O(1)
