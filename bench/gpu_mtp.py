"""MTP speculative decoding on the CUDA path: what a verify step costs against the graphed
greedy step it replaces, on the GLM-4.7-Flash shape (bench/gpu_glm.py's `FLASH`, all 47
layers unless --layers) with a random MTP layer of the real shape beside it.

Speculative decoding (engine/models/mtp.py) runs each step eagerly: one prefill of [token,
draft] through the decoder (`Engine._hidden_forward`) and one forward of the PyTorch MTP layer,
with host reads of both argmaxes; plain greedy decoding replays one captured CUDA graph per
token. Random MTP weights draft almost nothing right, so besides the real loop (acceptance ~1)
the same loop runs with every draft forced right (acceptance 2, the MTP layer still run): the
two bound what a trained MTP layer gives. Reported, all in this run on the same prompt
(--context tokens, dense state, as `ask` over retrieved passages):

- plain greedy ms/token (the graph), speculative ms/token at acceptance ~1 and at 2;
- the verify step's ms and the MTP layer's share of it;
- the break-even acceptance length: step ms / plain ms (speculation pays off above it; 2 is the
  most one draft per step can give);
- the MTP layer's pass over the prompt (its own KV, before the first draft), which the
  speculative figures per token include (as `GenerationResult.decode_s` does);
- whether the speculative tokens equal plain greedy's (they must).

    python3 bench/gpu_mtp.py --json /tmp/out/gpu_mtp.json      (on the H200: writes ~60 GB to /dev/shm)
    python3 bench/gpu_mtp.py --smoke   (the same code on the CPU at tiny sizes under the Triton
                                        interpreter: a few minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the kernels run in its interpreter on CPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu import FAILED, RESULTS, say, stage  # noqa: E402
from gpu_glm import (  # noqa: E402
    FLASH,
    SMOKE_FLASH,
    bench_setup,
    checkpoint_bytes,
    dump,
    load_engine,
    ratio,
    sync,
    tokenizer_vocab,
    work_dir,
    write_checkpoint,
)


def write_mtp_layer(path: Path, shape: dict, device: torch.device) -> None:
    """A random MTP layer as GLM checkpoints store it (`model.layers.{n_layers}.*`): the last
    decoder layer's tensors (an MoE layer) under the next index, plus enorm / hnorm / eh_proj /
    shared_head.norm, in the checkpoint's dtype (write_checkpoint's), as one more file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    n, hidden = shape["num_hidden_layers"], shape["hidden_size"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    last = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k.startswith(f"model.layers.{n - 1}."):
                    last[k.replace(f"layers.{n - 1}.", f"layers.{n}.", 1)] = st.get_slice(k).get_shape()
    out = {}
    for k, dims in last.items():
        t = torch.empty(dims, dtype=dtype, device=device)
        if "norm" in k and not k.endswith("bias"):
            t.fill_(1.0)
        elif k.endswith("bias"):
            t.zero_()
        else:
            t.normal_(0.0, 0.02)
        out[k] = t.cpu()
    p = f"model.layers.{n}."
    for name, dims in (("enorm.weight", (hidden,)), ("hnorm.weight", (hidden,)), ("shared_head.norm.weight", (hidden,)),
                       ("eh_proj.weight", (hidden, 2 * hidden))):
        out[p + name] = torch.ones(dims, dtype=dtype) if "norm" in name else \
            torch.empty(dims, dtype=dtype, device=device).normal_(0.0, 0.02).cpu()
    save_file(out, str(path / "model-mtp.safetensors"))
    say(f"   wrote the MTP layer ({(path / 'model-mtp.safetensors').stat().st_size / 2**30:.2f} GiB)")


@torch.inference_mode()
def measure(engine, context: int, new: int) -> dict:
    from docqa.engine.benchmark import bench_prompt
    from docqa.engine.models.mtp import _Take, speculative_decode

    prompt = bench_prompt(engine.tokenizer, context)
    dev = engine.device
    engine.speculative = False
    engine.generate(prompt, 2 * 16, stop_ids=())  # the graph captured, kernels compiled
    plain = engine.generate(prompt, new, stop_ids=())
    plain_ms = plain.decode_s / (len(plain.token_ids) - 1) * 1e3
    engine.speculative = True
    engine.generate(prompt, 8, stop_ids=())  # the MTP layer built, the verify shapes compiled
    spec = engine.generate(prompt, new, stop_ids=())
    spec_ms = spec.decode_s / (len(spec.token_ids) - 1) * 1e3

    # every draft right (acceptance 2): plain greedy's next token, the MTP layer still run
    want = plain.token_ids
    take = _Take(new, set())
    state = engine.new_state(context + new + 16)
    marks = {}

    def draft(out):  # called first when the loop starts: the MTP layer's pass over the prompt is done
        marks.setdefault("loop", time.perf_counter())
        return want[len(out)] if len(out) < len(want) else 0

    sync(dev)
    steps, _, accepted = speculative_decode(
        engine._hidden_forward, state, torch.tensor(prompt, device=dev), take, mtp=engine.mtp_layer, out=take.out,
        draft=draft, on_chunk=lambda done, total: marks.__setitem__("prefilled", time.perf_counter()))
    sync(dev)
    end = time.perf_counter()
    forced_ms = (end - marks["prefilled"]) / (len(take.out) - 1) * 1e3  # as decode_s counts: the prompt pass too

    # the MTP layer alone: one draft (one row) per call, as each step runs it
    mtp = engine.mtp_layer
    mstate = mtp.new_state(capacity=64)
    h = torch.randn(1, engine.config.hidden, dtype=engine.dtype, device=dev)
    ids = torch.tensor([1], device=dev)
    int(mtp(h, ids, mstate)[-1].argmax())
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(16):
        int(mtp(h, ids, mstate)[-1].argmax())
    sync(dev)
    mtp_ms = (time.perf_counter() - t0) / 16 * 1e3
    step_ms = (end - marks["loop"]) / steps * 1e3
    out = {"context": context, "new_tokens": new, "plain_ms_per_token": plain_ms,
           "speculative_ms_per_token": spec_ms, "acceptance_length": spec.speculative["acceptance_length"],
           "forced_ms_per_token": forced_ms, "forced_acceptance_length": (steps + accepted) / steps,
           "verify_step_ms": step_ms, "mtp_layer_ms": mtp_ms,
           "mtp_prompt_pass_s": marks["loop"] - marks["prefilled"],
           "break_even_acceptance_length": ratio(step_ms, plain_ms),
           "speculative_vs_plain": ratio(plain_ms, spec_ms), "forced_vs_plain": ratio(plain_ms, forced_ms),
           "same_tokens": spec.token_ids == plain.token_ids and take.out == plain.token_ids,
           # bf16: a verify prefill (GEMMs) and a graphed step (GEMVs) round differently, so a near-tie
           # may go the other way; where the speculative tokens first differ from plain greedy's
           "first_difference": next((i for i, (x, y) in enumerate(zip(spec.token_ids, plain.token_ids)) if x != y),
                                    None)}
    say(f"   plain {plain_ms:.2f} ms/token; speculative {spec_ms:.2f} ms/token at acceptance "
        f"{out['acceptance_length']:.2f}, {forced_ms:.2f} at {out['forced_acceptance_length']:.2f}; "
        f"verify step {step_ms:.2f} ms (MTP layer {mtp_ms:.2f}); break-even acceptance "
        f"{out['break_even_acceptance_length']}; same tokens: {out['same_tokens']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--layers", type=int, default=FLASH["num_hidden_layers"], help="decoder layers (47: the real model)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768], help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default=None,
                    help="default: .gpu/tokenizer (bench/gpu_prepare.py); with --smoke a 257-token byte-level one "
                         "(the real 49K-token head makes each interpreted decode step minutes)")
    ap.add_argument("--work", default=None, help="where the checkpoint goes (default: /dev/shm if it has room)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    shape = dict(FLASH, num_hidden_layers=a.layers)
    if a.smoke:
        shape, a.contexts, a.new_tokens = dict(SMOKE_FLASH), [40], 6
    device, tokenizer_dir, tmp = bench_setup("gpu_mtp.py", a.smoke, a.tokenizer)
    shape_layer = dict(shape, num_hidden_layers=1)  # the MTP layer: one more MoE layer, roughly
    need = checkpoint_bytes(shape, tokenizer_vocab(tokenizer_dir)) + checkpoint_bytes(shape_layer, 0)
    work = work_dir(a.work, need)
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "glm4.7-flash-mtp"
    r = RESULTS["glm4.7-flash-mtp"] = {"shape": shape}
    stage("write checkpoint (transformers)", write_checkpoint, "flash", shape, ckpt, tokenizer_dir, device,
          max(a.contexts) + 4 * a.new_tokens + 64)
    if not FAILED:
        stage("write MTP layer", write_mtp_layer, ckpt, shape, device)
    if not FAILED:
        engine = stage("Engine.load", load_engine, ckpt, device)
        for n in a.contexts if engine is not None else []:
            r[f"context_{n}"] = stage(f"speculative vs plain @ {n}", measure, engine, n, a.new_tokens)
            dump(a.json)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    dump(a.json)
    print(json.dumps(RESULTS, indent=1, default=str))
    if FAILED:
        sys.exit(f"gpu_mtp.py: failed stages: {FAILED}")


if __name__ == "__main__":
    main()
