"""Passkey retrieval with the default model: dense vs sparse attention, inside and beyond 8K.

A 5-digit key is planted in contract text (the CUAD contracts in shared/corpus/qa) at depths
0.1 / 0.5 / 0.9 of the haystack (`--depths` for more); the model is asked for it with greedy
decoding. A trial passes when the key's digits appear in the answer.

    .venv/bin/python bench/passkey.py --out bench/results/passkey.jsonl \
        --runs dense:2048,4096,8192,16384 sparse:2048,4096,8192,16384,32768

Each finished trial is appended to the JSONL file at once (a long run can be stopped and its
partial results kept); `--table` prints the Markdown table of a JSONL file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from docqa.engine.dense import DenseKVState
from docqa.engine.generate import Engine
from docqa.engine.router import Route
from docqa.engine.settings import EngineSettings
from docqa.engine.sparse_state import SparseKVState

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "qa"
INTRO = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the pass key.\n\n")
QUESTION = "\n\nWhat is the pass key? Answer with the 5-digit number only."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
DEPTHS = (0.1, 0.5, 0.9)  # their keys come first from the seed, so added depths leave them alone


def corpus_lines(corpus: Path) -> list[str]:
    lines = []
    for f in sorted(corpus.glob("*.cuad.txt")):
        lines += [" ".join(line.split()) for line in f.read_text(errors="replace").splitlines()]
    return [line for line in lines if line]


def build_prompt(engine: Engine, lines: list[str], n_tokens: int, depth: float, key: str) -> list[int]:
    """Chat prompt of about n_tokens tokens with the needle at `depth` of the haystack."""
    tok = engine.tokenizer
    overhead = len(engine.chat_prompt(INTRO + NEEDLE.format(key=key) + QUESTION)) + 8
    budget = n_tokens - overhead
    hay, used = [], 0
    for line in lines:
        n = len(tok.encode(line + "\n", add_bos=False))
        if used + n > budget:
            break
        hay.append(line)
        used += n
    if used < budget // 2:
        raise SystemExit(f"the corpus holds only {used} tokens of haystack; {budget} wanted")
    cut = int(len(hay) * depth)
    text = "\n".join(hay[:cut]) + NEEDLE.format(key=key) + "\n".join(hay[cut:])
    ids = engine.chat_prompt(INTRO + text + QUESTION)
    return ids + tok.encode("The pass key is", add_bos=False)


def needle_span(engine: Engine, lines: list[str], n_tokens: int, depth: float, key: str) -> int:
    """Approximate token index of the needle (the prompt up to it, re-tokenised)."""
    ids = build_prompt(engine, lines, n_tokens, depth, key)
    text = engine.tokenizer.decode(ids, skip_special=False)
    return len(engine.tokenizer.encode(text[: text.index(f"The pass key is {key}")], add_bos=False))


class RouteRecorder(SparseKVState):
    """Records, per layer, whether any kv head routed the needle's blocks into the last chunk."""

    needle: tuple[int, int] = (0, 0)

    def attend(self, layer, q, k, v, positions):
        out = super().attend(layer, q, k, v, positions)
        r = self.last_route  # the routing of the call's last queries (its tail, with route_tail)
        if r is not None and r.block_idx.numel():
            b = self.settings.block_size
            lo, hi = self.needle[0] // b, (self.needle[1] - 1) // b
            hit = ((r.block_idx >= lo) & (r.block_idx <= hi)).any(1)  # [Hkv]
            # Blocks from r.end on lie in the last query's window: read without routing.
            self.in_window = hi >= r.end
            hit |= self.in_window
            self.hits[layer] = hit.float().mean().item()
        return out


class OracleRouteState(SparseKVState):
    """Routes the needle's blocks for every kv head, whatever the scores say (they replace the
    latest-positioned picks: a route keeps no ranks). Separates "the router missed the needle"
    from "the model, shown the needle through the sparse attention, still cannot read it out"."""

    needle: tuple[int, int] = (0, 0)

    def _route(self, layer, q_route, c_end):
        r = super()._route(layer, q_route, c_end)
        b = self.settings.block_size
        lo, hi = max(r.first, self.needle[0] // b), min(r.end - 1, (self.needle[1] - 1) // b)
        if hi < lo or r.covered:
            return r
        want = torch.arange(lo, hi + 1, device=r.block_idx.device)
        rows = []
        for picked in r.block_idx:
            keep = picked[~torch.isin(picked, want)]
            keep = keep[: max(0, picked.numel() - want.numel())]
            rows.append(torch.sort(torch.cat([keep, want]))[0])
        return Route(torch.stack(rows), r.first, r.end)


def diagnose(engine, lines, target, depth, key, settings, device):
    """Fraction of layers' kv heads whose routing (for the final chunk) includes the needle."""
    ids = build_prompt(engine, lines, target, depth, key)
    p = needle_span(engine, lines, target, depth, key)
    state = RouteRecorder(engine.config, settings, engine.rope, device=device)
    state.needle, state.hits = (p - 4, p + 24), {}
    engine.prefill_chunk = settings.chunk_size
    engine.model(torch.tensor(ids), state, last_only=True, chunk_size=settings.chunk_size)
    frac = sum(state.hits.values()) / max(1, len(state.hits))
    return frac, p, len(ids), getattr(state, "in_window", False)


def run_trial(engine: Engine, ids: list[int], mode: str, settings: EngineSettings,
              device: str = "cpu", needle: tuple[int, int] | None = None) -> tuple[str, float]:
    if mode == "sparse" and needle is not None:
        state = OracleRouteState(engine.config, settings, engine.rope, device=device)
        state.needle = needle
    elif mode == "sparse":
        state = SparseKVState(engine.config, settings, engine.rope, device=device)
    else:
        state = DenseKVState(engine.config, engine.rope, capacity=len(ids) + 16, device=device)
    engine.prefill_chunk = settings.chunk_size
    t0 = time.perf_counter()
    result = engine.generate(ids, max_new_tokens=10, state=state)
    return result.text, time.perf_counter() - t0


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cells: dict[tuple, list] = defaultdict(list)
    for r in rows:
        # Rows measured before route_chunk existed routed once per 512-token prefill chunk.
        # ... and before route_tail existed, without a routing tail.
        routing = (f'{r["positions"]}, {r.get("score", "minmax")}, k={r.get("top_k", 16)}, '
                   f'r={r.get("route_chunk", 512)}, t={r.get("route_tail", 0)}, w={r.get("window", 1024)}')
        if r.get("route_shared"):
            routing += f', shared {r["route_shared"]}'
        if r.get("oracle"):
            routing += ", oracle routing"
        cells[(r["mode"], routing, r["target"])].append(r)
    depths = sorted({r["depth"] for r in rows})
    out = ["| mode | positions, block score, top_k, route_chunk, route_tail, window | target tokens | prompt tokens | "
           + " | ".join(f"depth {d:g}" for d in depths) + " | passed | s/trial |",
           "| --- " * (len(depths) + 6) + "|"]
    for (mode, pos, target), rs in sorted(cells.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        by_depth = {r["depth"]: r for r in rs}
        marks = []
        for d in depths:
            r = by_depth.get(d)
            answer = r["answer"].strip()[:16].replace("\n", "⏎").replace("|", "/") if r else ""
            marks.append("—" if r is None else ("✓" if r["ok"] else f"✗ `{answer}`"))
        ok = sum(r["ok"] for r in rs)
        secs = sum(r["seconds"] for r in rs) / len(rs)
        ptoks = max(r["prompt_tokens"] for r in rs)
        out.append(f"| {mode} | {pos if mode == 'sparse' else '—'} | {target} | {ptoks} | "
                   + " | ".join(marks) + f" | {ok}/{len(rs)} | {secs:.0f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", default=["dense:2048,4096,8192,16384",
                                                  "sparse:2048,4096,8192,16384,32768"],
                    help="MODE[/POSITIONS[/SCORE[/TOP_K[/ROUTE_CHUNK[/ROUTE_TAIL[/WINDOW[/SHARED]]]]]]]:LEN,LEN,... with MODE "
                         "dense|sparse; empty fields take EngineSettings' defaults")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)),
                    help="needle depths, comma-separated (e.g. 0.1,0.3,0.5,0.7,0.9)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/passkey.jsonl"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="folder of *.cuad.txt haystack text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the engine itself is CPU-first)")
    ap.add_argument("--diagnose", action="store_true",
                    help="for sparse runs, report how often routing picks the needle's blocks")
    ap.add_argument("--oracle", action="store_true",
                    help="sparse runs route the needle's blocks for every head (a diagnostic bound)")
    ap.add_argument("--table", action="store_true", help="print the table of --out and exit")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.out))
        return 0

    engine = Engine.load(args.model, device=args.device)
    if args.device != "cpu":
        engine.model.to(args.device)
        engine.rope.inv_freq = engine.rope.inv_freq.to(args.device)
        torch.set_default_device(args.device)  # generate() builds its id tensors on the default device
    lines = corpus_lines(args.corpus)
    rng = random.Random(args.seed)
    # The same keys and haystacks for every mode, so rows differ only by attention.
    depths = [float(x) for x in args.depths.split(",")]
    keys = {d: f"{rng.randrange(10000, 100000)}" for d in DEPTHS + tuple(sorted(set(depths) - set(DEPTHS)))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for spec in args.runs:
        mode_part, lens = spec.split(":")
        mode, *opts = mode_part.split("/")
        opts += [""] * (7 - len(opts))
        d = EngineSettings()
        settings = EngineSettings(positions=opts[0] or d.positions, block_score=opts[1] or d.block_score,
                                  top_k=int(opts[2] or d.top_k), route_chunk=int(opts[3] or d.route_chunk),
                                  route_tail=int(opts[4] or d.route_tail), window=int(opts[5] or d.window),
                                  route_shared=int(opts[6] or d.route_shared))
        for target in (int(x) for x in lens.split(",")):
            for depth in depths:
                if args.diagnose and mode == "sparse":
                    frac, pos, n, in_window = diagnose(engine, lines, target, depth, keys[depth], settings, args.device)
                    print(json.dumps({"diagnose": spec, "positions": settings.positions,
                                      "score": settings.block_score, "top_k": settings.top_k,
                                      "route_tail": settings.route_tail, "target": n, "depth": depth,
                                      "needle_at": pos, "needle_in_window": in_window,
                                      "needle_routed_fraction": round(frac, 3)}), flush=True)
                    continue
                ids = build_prompt(engine, lines, target, depth, keys[depth])
                needle = None
                if args.oracle and mode == "sparse":
                    p = needle_span(engine, lines, target, depth, keys[depth])
                    needle = (p - 4, p + 24)
                answer, secs = run_trial(engine, ids, mode, settings, args.device, needle)
                rec = {"mode": mode, "positions": settings.positions, "score": settings.block_score,
                       "top_k": settings.top_k, "route_chunk": settings.route_chunk,
                       "route_tail": settings.route_tail, "window": settings.window,
                       "route_shared": settings.route_shared, "target": target,
                       "prompt_tokens": len(ids), "depth": depth, "key": keys[depth],
                       "answer": answer, "ok": keys[depth] in answer.replace(",", ""),
                       "seconds": round(secs, 1), "device": args.device}
                if needle is not None:
                    rec["oracle"] = True
                with args.out.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                print(json.dumps(rec), flush=True)
    if args.out.exists():
        print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
