"""The host's share of `docqa serve`'s decode steps, measured on the CPU: the server, its
engine worker, the batch session (scheduler, block manager, sampling, detokenising) and the
streaming clients run as they do on the GPU machine, but the model's forward is replaced by
a wait as long as the GPU's (`--step-ms` per decode step, `--prefill-us` per prompt token;
a sleep, which lets other threads run as a GPU wait does). Whatever a step takes beyond that
wait is host work: ours to cut. Same `serve` stage as bench/batch_gpu.py (its `--profile`
splits the GPU run's steps the same way), on a tiny random checkpoint with the default
model's tokenizer (its detokenising is what streaming pays per token).

    python3 bench/serve_host.py [--clients 32] [--step-ms 8] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from docqa.bench.batch_gpu import serve
from docqa.engine.batch import BatchSession


class WaitingRunner:
    """`ModelRunner.run` as far as the host sees it: the GPU's time waited, then logits [S, V]
    whose greedy token is a random ordinary one (never a stop token)."""

    def __init__(self, vocab: int, step_s: float, prefill_s_per_token: float, seed: int = 0):
        self.vocab, self.step_s, self.per_token = vocab, step_s, prefill_s_per_token
        self.g = torch.Generator().manual_seed(seed)

    def run(self, work) -> torch.Tensor:
        tokens = sum(w.count for w in work)
        time.sleep(self.step_s if tokens == len(work) else tokens * self.per_token)
        rows = sum(w.samples for w in work)
        logits = torch.zeros(rows, self.vocab)
        logits[torch.arange(rows), torch.randint(300, 20000, (rows,), generator=self.g)] = 1.0
        return logits


def tiny_engine(folder: Path):
    """A 2-layer random Llama with the default model's tokenizer, on the Triton decoder (CPU
    tensors: only its config, tokenizer and batch session are used here)."""
    import transformers

    from docqa.engine import Engine

    tok = Engine.load_tokenizer(None)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=16384, tie_word_embeddings=False)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    tok.tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.token_text(tok.bos_id), "eos_token": tok.token_text(tok.eos_id),
        "add_bos_token": tok.add_bos, "chat_template": tok.chat_template}))
    return Engine.load(folder, device="cpu", kernels="triton")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--answer-tokens", type=int, default=128)
    ap.add_argument("--step-ms", type=float, default=8.0, help="the GPU's time for one decode step of the batch")
    ap.add_argument("--prefill-us", type=float, default=20.0, help="the GPU's time per prompt token prefilled")
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = tiny_engine(Path(tempfile.mkdtemp(prefix="docqa-serve-host-")))
    # a pool as the GPU's holds (the CPU default keeps 4K-token prompts out of the batch)
    session = engine._batch = BatchSession(engine, pool_tokens=a.clients * (a.prompt_tokens + a.answer_tokens) * 2)
    session.runner = WaitingRunner(engine.config.vocab, a.step_ms / 1e3, a.prefill_us / 1e6)
    out = serve(engine, a.clients, a.prompt_tokens, a.answer_tokens, profile=True)
    dec = out["steps"]["decode"]
    host = sum(v for k, v in dec.items() if k.endswith("_ms")) - a.step_ms
    ideal = a.clients * 1e3 / a.step_ms
    print(f"decode steps: {dec['steps']}, {sum(v for k, v in dec.items() if k.endswith('_ms')):.2f} ms each "
          f"({a.step_ms} ms the GPU's, {host:.2f} ms host); decode phase {out['decode_phase_tok_s']:.0f} tok/s "
          f"(the GPU's wait alone: {ideal:.0f}); whole run {out['decode_tok_s_concurrent']:.0f} tok/s; "
          f"worker outside steps {out['steps']['outside_steps_s']:.2f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
