"""FP8 block-scaled weights on the Llama family's CUDA decoder (engine/gpu/model.py `CudaDecoder`)
against the bf16 weights they were quantised from, in one run on one GPU.

For each architecture (bench/gpu.py's Llama-3-8B and Qwen3-8B shapes) a random-weight bf16
checkpoint written by transformers (`save_pretrained`, the tokenizer of bench/gpu_prepare.py
beside it) and the same weights in the official FP8 layout (every linear layer's matrix e4m3 with
a scale per 128 x 128 block: bench/gpu_glm.py `write_fp8_checkpoint`), each loaded with
`Engine.load(dir, device="cuda")` as `docqa` does, and measured:

- weights on the device (GiB), and without the bf16 embeddings and head;
- the `ask` path (bench/gpu.py `ask_path`): a ~4K-token prompt through the dense state, prefill s
  and graphed decode ms/token;
- `docqa engine bench --context N` (`context_benchmark`, the `--read-all` path) at --contexts;
- agreement: the FP8 model's logits on a --check-tokens prompt against the bf16 model's
  (relative error of all logits, and how often the argmax is the same);

and FP8 / bf16 ratios of each. Exits non-zero when a stage fails; prints JSON (and writes it
with --json).

    TESTS=0 bash bench/gpu_run.sh && PYTHONPATH=/tmp/p:/tmp/site python3 bench/gpu_fp8.py \
        --json $OUT/gpu_fp8.json                                   (on the H200: ~5 min)
    python3 bench/gpu_fp8.py --smoke --tokenizer DIR   (a tiny shape on the CPU under the Triton
                                                        interpreter: the same code, in minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

if "--smoke" in sys.argv:  # before triton is imported: the kernels run in its interpreter on CPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gpu import FAILED, RESULTS, ask_path, hf_config, say, stage  # noqa: E402  (bench/gpu.py)
from gpu_glm import write_fp8_checkpoint  # noqa: E402

BLOCK = (128, 128)  # the official FP8 checkpoints' blocks


def ratio(a: float, b: float) -> float:
    return float(f"{a / b:.3g}")


def write_bf16(arch: str, path: Path, tokenizer_dir: Path, device: torch.device, max_pos: int, smoke: bool) -> None:
    """Random bf16 weights written by transformers (built on the device), plus the tokenizer."""
    import transformers

    config = hf_config(arch, max_pos)
    if smoke:  # the same architecture at a size the interpreter runs in minutes
        for k, v in dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64).items():
            setattr(config, k, v)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(prev)
    model.save_pretrained(path, max_shard_size="5GB")
    del model
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)


def load(path: Path, device: torch.device):
    from docqa.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(path, device=str(device), kernels="triton", dtype=torch.bfloat16)
    say(f"   loaded in {time.perf_counter() - t0:.1f} s: {type(engine.model).__name__}, {engine.dtype}")
    if type(engine.model).__name__ != "CudaDecoder":
        raise RuntimeError(f"Engine.load built {type(engine.model).__name__}, not the Llama family's CUDA decoder")
    return engine


@torch.inference_mode()
def check_logits(engine, n: int) -> torch.Tensor:
    """Every position's logits of an n-token prompt through the dense state (on the host, fp32)."""
    from docqa.engine.benchmark import bench_prompt

    ids = bench_prompt(engine.tokenizer, n)
    return engine.prefill(ids, engine.new_state(n + 16), all_logits=True).float().cpu()


def run_arch(arch: str, a, device: torch.device, tokenizer_dir: Path, work: Path) -> None:
    from docqa.engine.benchmark import context_benchmark

    r = RESULTS[arch] = {"block": list(BLOCK)}
    src, dst = work / f"{arch}-bf16", work / f"{arch}-fp8"
    stage(f"{arch}: write bf16 checkpoint", write_bf16, arch, src, tokenizer_dir, device,
          max(a.contexts + [8192]) + 1024, a.smoke)
    if not (src / "config.json").exists():
        return
    stage(f"{arch}: quantise to FP8 ({BLOCK[0]} x {BLOCK[1]} blocks)", write_fp8_checkpoint, src, dst, BLOCK, device)
    logits = {}
    for name, path in (("fp8", dst), ("bf16", src)):
        if not (path / "config.json").exists():
            continue
        engine = stage(f"{arch}: Engine.load {name}", load, path, device)
        if engine is None:
            continue
        w = engine.model.w
        ends = sum(t.numel() * t.element_size() for t in {id(t): t for t in (w.embed, w.lm_head)}.values())
        r[f"{name}_weights_GiB"] = float(f"{w.nbytes() / 2**30:.4g}")
        r[f"{name}_layer_weights_GiB"] = float(f"{(w.nbytes() - ends) / 2**30:.4g}")
        say(f"   {name}: weights {r[f'{name}_weights_GiB']} GiB, {r[f'{name}_layer_weights_GiB']} GiB "
            "without embeddings and head")
        logits[name] = stage(f"{arch}: {name} logits of {a.check_tokens} tokens", check_logits, engine, a.check_tokens)
        res = stage(f"{arch}: {name} ask path", ask_path, engine, a.prompt_tokens, a.decode_tokens)
        if res:
            r[f"{name}_ask"] = res
            say(f"   {name} ask: prefill {res['prefill_s']:.3f} s, decode {res['decode_ms']:.2f} ms/token")
        for n in a.contexts:
            res = stage(f"{arch}: {name} engine bench @ {n}", context_benchmark, engine, n,
                        a.question_tokens, a.decode_tokens)
            if res:
                r[f"{name}_{n}"] = res
                say(f"   {name} @ {n}: prefill {res['prefill_s']:.2f} s, decode {res['decode_ms_per_token']:.2f} ms/token, "
                    f"first token {res['first_token_s']:.3f} s")
        dump(a.json)
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    f, b = logits.get("fp8"), logits.get("bf16")
    if f is not None and b is not None:
        r["fp8_vs_bf16_logits"] = {"relative_error": float(f"{((f - b).norm() / b.norm()).item():.3g}"),
                                   "argmax_agreement": float(f"{(f.argmax(-1) == b.argmax(-1)).float().mean():.3g}")}
        say(f"   FP8 vs bf16 logits: {r['fp8_vs_bf16_logits']}")
    over = {}
    if r.get("fp8_weights_GiB") and r.get("bf16_weights_GiB"):
        over["weights"] = ratio(r["fp8_weights_GiB"], r["bf16_weights_GiB"])
        over["layer_weights"] = ratio(r["fp8_layer_weights_GiB"], r["bf16_layer_weights_GiB"])
    if r.get("fp8_ask") and r.get("bf16_ask"):
        over["ask_prefill"] = ratio(r["fp8_ask"]["prefill_s"], r["bf16_ask"]["prefill_s"])
        over["ask_decode"] = ratio(r["fp8_ask"]["decode_ms"], r["bf16_ask"]["decode_ms"])
    for n in a.contexts:
        f, b = r.get(f"fp8_{n}"), r.get(f"bf16_{n}")
        if f and b:
            over[f"prefill_{n}"] = ratio(f["prefill_s"], b["prefill_s"])
            over[f"decode_{n}"] = ratio(f["decode_ms_per_token"], b["decode_ms_per_token"])
    r["fp8_over_bf16"] = over
    say(f"   FP8 / bf16: {over}")
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)


def dump(path: str | None) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(RESULTS, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU under TRITON_INTERPRET=1")
    ap.add_argument("--archs", nargs="+", default=["llama3-8b"], choices=["llama3-8b", "qwen3-8b"])
    ap.add_argument("--contexts", type=int, nargs="*", default=[32768], help="`engine bench` contexts (none: skip)")
    ap.add_argument("--check-tokens", type=int, default=1024, help="prompt of the FP8-vs-bf16 logits check")
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="the ask path's prompt")
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--tokenizer", default=str(ROOT / ".gpu" / "tokenizer"))
    ap.add_argument("--work", default=None, help="where checkpoints go (default: a temp dir)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if a.smoke:
        a.contexts, a.check_tokens, a.prompt_tokens = [256], 64, 128
        a.question_tokens, a.decode_tokens = 8, 4
    device = torch.device("cpu" if a.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device (use --smoke to run the code on the CPU)")
    RESULTS["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (TRITON_INTERPRET=1)"
    tokenizer_dir = Path(a.tokenizer)
    if not (tokenizer_dir / "tokenizer.json").exists():
        sys.exit(f"no tokenizer at {tokenizer_dir}: run bench/gpu_prepare.py first")
    with tempfile.TemporaryDirectory(dir=a.work) as work:
        for arch in a.archs:
            run_arch(arch, a, device, tokenizer_dir, Path(work))
            dump(a.json)
    print(json.dumps(RESULTS, indent=1))
    if FAILED:
        sys.exit(f"failed stages: {FAILED}")


if __name__ == "__main__":
    main()
