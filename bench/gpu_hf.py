"""HF transformers on the same 8B shape: the library reference for bench/gpu.py's table.

`hf_figures` builds `LlamaForCausalLM` with bench/gpu.py's shape (random bf16 weights, SDPA
attention, the library's default dynamic KV cache) and times what a user of the library
gets: prefill of n tokens in one forward (last position's logits only) and greedy decode
steps after it. Called by `bench/gpu.py --hf`; runs alone too:

    python3 bench/gpu_hf.py [--contexts 32768 131072] [--layers 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _config(shape, max_pos: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim, rope_theta=shape.rope_theta, rms_norm_eps=shape.eps,
        max_position_embeddings=max_pos, tie_word_embeddings=False, attn_implementation="sdpa",
    )


def _forward(model, ids, past=None):
    # only the last position's logits: all 128K x 128256 of them would take 64 GiB
    try:
        return model(input_ids=ids, past_key_values=past, use_cache=True, logits_to_keep=1)
    except TypeError:  # older releases name it num_logits_to_keep
        return model(input_ids=ids, past_key_values=past, use_cache=True, num_logits_to_keep=1)


@torch.inference_mode()
def hf_figures(shape, contexts, decode_steps: int = 8, say=print, device: str = "cuda") -> dict:
    """{f"hf_prefill_{n}_s", f"hf_decode_{n}_ms", f"hf_peak_{n}_GiB"} for each context n that fits."""
    import transformers
    from transformers import LlamaForCausalLM

    out: dict = {"hf_version": transformers.__version__}
    t0 = time.time()
    # built in bf16 on the device: 8B parameters initialised on the host took minutes
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(_config(shape, max(contexts) + decode_steps + 64)).eval()
    finally:
        torch.set_default_dtype(prev)
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    say(f"   transformers {transformers.__version__}: {shape.layers}-layer model built in {time.time() - t0:.1f} s")
    g = torch.Generator(device=device).manual_seed(0)
    for n in contexts:
        past = None
        try:
            ids = torch.randint(0, shape.vocab, (1, n), device=device, generator=g)
            _forward(model, ids[:, :1024])  # kernels and workspaces, not part of the timing
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.time()
            res = _forward(model, ids)
            sync()
            out[f"hf_prefill_{n}_s"] = p = time.time() - t0
            past = res.past_key_values
            tok = res.logits[:, -1:].argmax(-1)
            steps = []
            for _ in range(decode_steps):
                t1 = time.time()
                res = _forward(model, tok, past)
                tok = res.logits[:, -1:].argmax(-1)
                sync()
                steps.append((time.time() - t1) * 1e3)
            out[f"hf_decode_{n}_ms"] = ms = statistics.median(steps[1:] or steps)
            out[f"hf_peak_{n}_GiB"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
            say(f"   HF @ {n}: prefill {p:.2f} s, decode {ms:.1f} ms/token (median of {decode_steps - 1}), "
                f"peak {out[f'hf_peak_{n}_GiB']:.1f} GiB")
        except torch.OutOfMemoryError as e:
            say(f"   HF @ {n}: out of memory ({str(e)[:80]})")
        finally:
            del past
            if cuda:
                torch.cuda.empty_cache()
    del model
    if cuda:
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    from gpu_path import import_checkout

    import_checkout()
    from docqa.engine.gpu.model import LLAMA3_8B, Shape

    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--layers", type=int, default=LLAMA3_8B.layers)
    ap.add_argument("--decode-steps", type=int, default=8)
    a = ap.parse_args()
    print(hf_figures(Shape(layers=a.layers), a.contexts, a.decode_steps))
