"""`docqa engine ...`: raw generation, a self-check against HF transformers, and a benchmark.

Each command calls one engine function; like every command it runs under `cli_errors`: the
engine's user-facing errors (`CheckpointError`, `DeviceError`: `DocqaError`s) become one line
on stderr and exit code 1, and anything else is a bug, raised with its traceback under
DOCQA_DEBUG."""

from __future__ import annotations

import json
import sys
from enum import Enum

import typer

from . import config
from .clikit import cli_errors

engine_app = typer.Typer(help="The embedded LLM engine.\n\nExample: docqa engine generate \"Hello\" --chat",
                         no_args_is_help=True, add_completion=False)

ModelOpt = typer.Option(None, "--model", "-m", help="GGUF file or HF directory (default: DOCQA_MODEL, else the bundled SmolLM2-135M).")
DeviceOpt = typer.Option(None, "--device", help="cpu, cuda, cuda:N or auto (default: DOCQA_DEVICE, else auto: CUDA when present).")


class Effort(str, Enum):  # the values engine/chat.py REASONING_EFFORTS passes to the template
    low = "low"
    medium = "medium"
    high = "high"


# The thinking controls of reasoning models, shared by `ask`, `review` and `engine generate`.
NO_THINKING_HELP = ("Reasoning models (GLM-4.5+, Qwen3): answer without thinking (the chat template's "
                    "enable_thinking=false). A model that never thinks: no effect. Error if the template "
                    "thinks but has no switch.")
EFFORT_HELP = ("Reasoning models whose chat template takes reasoning_effort: how hard to think. "
               "Error on a template without it.")

DtypeOpt = typer.Option(None, "--dtype", help="float32, bfloat16 or float16 weights (default: bfloat16 on CUDA, float32 on the CPU).")


def _load(model, device=None, dtype=None):
    import torch

    from docqa.engine import Engine

    if (config.model_spec(model) or "").startswith("openai:"):
        raise typer.BadParameter("`docqa engine` runs the embedded engine; --model/DOCQA_MODEL names a model "
                                 "server (openai:...): pass a GGUF file or HF directory with --model")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype is not None and dtype not in dtypes:
        raise typer.BadParameter(f"--dtype must be one of {', '.join(dtypes)}")
    return Engine.load(model, device=device, dtype=dtypes.get(dtype))


@engine_app.command()
@cli_errors
def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    chat: bool = typer.Option(False, "--chat", help="Wrap the prompt in the model's chat template."),
    max_tokens: int = typer.Option(128, "--max-tokens", "-n", min=1, help="Most tokens to generate."),
    model: str | None = ModelOpt,
    device: str | None = DeviceOpt,
    dtype: str | None = DtypeOpt,
    temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy (deterministic)."),
    top_p: float = typer.Option(1.0, min=0.0, max=1.0, help="Nucleus sampling mass."),
    seed: int | None = typer.Option(None, help="Seed for sampling."),
    no_thinking: bool = typer.Option(False, "--no-thinking", help=NO_THINKING_HELP + " Needs --chat."),
    reasoning_effort: Effort | None = typer.Option(None, "--reasoning-effort", help=EFFORT_HELP + " Needs --chat."),
    speculative: bool | None = typer.Option(
        None, "--speculative/--no-speculative", help="Checkpoints with an MTP layer (GLM-4.5+, GLM-5): draft with it "
        "and verify with the model (same tokens as plain greedy; in bf16 on a GPU they can differ at near ties), or "
        "decode one token per forward. Default: on the CPU, off on the GPU (there a verify step costs 10-17 plain "
        "steps)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming."),
):
    """Generate text from PROMPT, streaming tokens to stdout (greedy by default). A reasoning
    model's thinking streams to stderr and is kept out of the text ("thinking" in --json).

    Example: docqa engine generate "What is a force majeure clause?" --chat --max-tokens 64
    """
    if top_p <= 0:  # the sampler's nucleus is (0, 1]
        raise typer.BadParameter("--top-p must be above 0")
    if (no_thinking or reasoning_effort) and not chat:
        raise typer.BadParameter("--no-thinking and --reasoning-effort go to the chat template: add --chat")
    from docqa.engine.chat import ThinkingTracker

    from .models import check_max_tokens

    engine = _load(model, device, dtype)
    if speculative is not None:
        engine.speculative = speculative
    # the template is checked for the switches asked for (engine/chat.py check_switches)
    ids = (engine.chat_prompt(prompt, thinking=False if no_thinking else None,
                              reasoning_effort=reasoning_effort.value if reasoning_effort else None) if chat
           else engine.tokenizer.encode(prompt))
    check_max_tokens(max_tokens, engine.config.max_position)
    in_thinking = ThinkingTracker(engine.tokenizer, ids)

    def stream(token, delta):
        out = sys.stderr if in_thinking(token) else sys.stdout
        out.write(delta)
        out.flush()

    res = engine.generate(ids, max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                          on_token=None if as_json else stream)
    if as_json:
        typer.echo(json.dumps({
            "text": res.text, "thinking": res.thinking, "token_ids": res.token_ids, "prompt_tokens": res.prompt_tokens,
            "stop_reason": res.stop_reason,
            "timings": {"prefill_s": res.prefill_s, "decode_s": res.decode_s,
                        "decode_tok_s": res.decode_tok_s},
            # MTP drafts (checkpoints with an MTP layer, greedy): steps, accepted, acceptance_length
            "speculative": res.speculative}))
    else:
        typer.echo("")


CHECK_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return",
    "The parties agree that the governing law of this Agreement shall be",
]


@engine_app.command()
@cli_errors
def check(
    model: str | None = ModelOpt,
    device: str | None = DeviceOpt,
    tokens: int = typer.Option(16, help="Greedy tokens to compare per prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Compare our logits and greedy output with HF transformers on the same weights.

    Example: docqa engine check --tokens 32
    """
    try:
        import torch
        import transformers
    except ImportError:
        typer.echo("error: the check needs HF transformers as the reference: "
                   "pip install 'docqa[reference]'", err=True)
        raise typer.Exit(1) from None
    engine = _load(model, device)
    ckpt = engine.checkpoint
    if ckpt.format == "gguf":
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt.path.parent), gguf_file=ckpt.path.name, dtype=torch.float32)
    else:
        ref = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=torch.float32)
    ref.eval()
    rows = []
    for text in CHECK_PROMPTS:
        ids = engine.tokenizer.encode(text)
        with torch.no_grad():
            want = ref(torch.tensor([ids])).logits[0]
        # on a GPU this compares the device's logits with the CPU reference
        got = engine.prefill(ids, engine.new_state(len(ids) + 1), all_logits=True).cpu()
        ours = engine.generate(ids, tokens, stop_ids=()).token_ids
        with torch.no_grad():
            theirs = ref.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens,
                                  do_sample=False)[0, len(ids):].tolist()
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        rows.append({"prompt": text, "max_abs_diff": (got - want).abs().max().item(),
                     "greedy_agree": agree, "greedy_tokens": tokens})
    # bf16 weights (the CUDA default) round every product: their logits are checked for
    # closeness relative to the logits' range, and greedy agreement is reported, not required
    exact = engine.dtype == torch.float32
    ok = all((r["max_abs_diff"] < 1e-3 and r["greedy_agree"] == tokens) if exact else r["max_abs_diff"] < 0.5
             for r in rows)
    if as_json:
        typer.echo(json.dumps({"ok": ok, "prompts": rows}))
    else:
        for r in rows:
            typer.echo(f"max|Δlogits| {r['max_abs_diff']:.2e}  greedy agree {r['greedy_agree']}/{tokens}"
                       f"  {r['prompt'][:40]!r}")
        typer.echo("OK: matches HF transformers" if ok else "MISMATCH against HF transformers")
    if not ok:
        raise typer.Exit(1)


@engine_app.command()
@cli_errors
def bench(
    model: str | None = ModelOpt,
    device: str | None = DeviceOpt,
    dtype: str | None = DtypeOpt,
    context: int | None = typer.Option(None, "--context", min=128, help="Benchmark the long-document path "
                                       "(`ask --read-all`) on a document of this many tokens instead."),
    decode_tokens: int = typer.Option(64, help="Tokens to decode for the decode rate."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Prefill tok/s at 512 and 2048 tokens, decode tok/s, peak RSS; with --context N, the
    long-document path: prefill seconds of N tokens, decode ms/token after them, and the first
    token of a 64-token question on the cached document.

    Example: docqa engine bench --device cuda --context 131072 --json
    """
    from docqa.engine.benchmark import benchmark, context_benchmark

    engine = _load(model, device, dtype)
    if context:
        say = (lambda m: None) if as_json else (lambda m: typer.echo(m, err=True))
        res = context_benchmark(engine, context, decode_tokens=decode_tokens, say=say)
    else:
        res = benchmark(engine, (512, 2048), decode_tokens)
    if as_json:
        typer.echo(json.dumps(res))
    elif context:
        typer.echo(f"context {res['context']} tokens on {res['device']} ({res['dtype']}, {res['state']}): "
                   f"prefill {res['prefill_s']:.2f} s ({res['prefill_tok_s']:,.0f} tok/s), "
                   f"decode {res['decode_ms_per_token']:.2f} ms/token, first token {res['first_token_s'] * 1e3:.1f} ms")
    else:
        for n, rate in res["prefill"].items():
            typer.echo(f"prefill {n:>5} tokens: {rate:8.1f} tok/s")
        typer.echo(f"decode: {res['decode_tok_s']:.1f} tok/s")
        typer.echo(f"peak RSS: {res['peak_rss_mib']:.0f} MiB")


def register(app) -> None:
    """Mount `docqa engine ...` on the CLI."""
    app.add_typer(engine_app, name="engine")
