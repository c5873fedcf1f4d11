"""MTP speculative decoding for GLM checkpoints that carry a next-token-prediction layer.

GLM-4.5+ and GLM-5 store one MTP layer after the decoder's (`model.layers.{n_layers}.*`,
DeepSeek-V3's design): for position i it takes the main model's final (normed) hidden state
h_i and the embedding of the token after it, e_{i+1}, and predicts the token after that:

    x = eh_proj([enorm(e_{i+1}) ; hnorm(h_i)]);  x = decoder_block(x)  (its own KV, position i)
    draft_{i+2} = argmax lm_head(shared_head.norm(x))

Greedy decoding with one draft per step: the main model verifies [last token, draft] in one
forward; if its prediction after the last token is the draft, both the draft and the main
model's next prediction are kept (two tokens for one forward), else only its own prediction
(the draft's KV entry is truncated away). Every kept token is the main model's argmax, so the
output equals plain greedy decoding; the acceptance length (tokens per main forward) is the
speed-up's measure.

On the Triton decoders (engine/gpu: `CudaDecoder` for GLM-4.5, `GlmCudaDecoder` for GLM-4.7-Flash
and GLM-5) the verify forward is their prefill of the two tokens (eager, not the captured decode
graph; `Engine._hidden_forward`) and the MTP layer is this module on the same device. States
that route blocks per prefill chunk (the engine's sparse settings on a model without an indexer)
would verify differently from decode's per-token routing: they decode one token per step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..config import ModelConfig
from .glm import Block, GlmModel, assign_strict, normalise_weights
from ..rope import Rope
from .llama import Linear, RMSNorm


def mtp_config(config: ModelConfig, has_indexer: bool = True) -> ModelConfig:
    """The one-layer config of the MTP block: a MoE (sparse) layer; in a DSA model it runs its
    own indexer when the checkpoint stores one, else attends densely (no layer before it in
    its own state could lend it an index)."""
    moe = dataclasses.replace(config.moe, layer_types=("sparse",)) if config.moe else None
    dsa = dataclasses.replace(config.dsa, indexer_types=("full",)) if config.dsa and has_indexer else None
    return dataclasses.replace(config, n_layers=1, moe=moe, dsa=dsa, mtp_layers=0)


class SharedHead(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = RMSNorm(config.hidden, config.rms_eps)
        self.head = Linear(config.hidden, config.vocab)


def take_mtp_weights(tensors: dict[str, torch.Tensor], config: ModelConfig, dtype: torch.dtype) -> dict:
    """Pop the MTP layers' tensors (`layers.{n >= n_layers}.*`, names without `model.`) out of a
    CUDA decoder's checkpoint tensors, as HF names for `MTPLayer.from_weights`. The layer runs as
    the PyTorch module, so FP8 matrices are dequantised here, one at a time, to `dtype`."""
    from .fp8 import dequantize_blocks

    mtp = {"model." + n: tensors.pop(n) for n in [n for n in tensors if n.startswith("layers.")
                                                  and int(n.split(".")[1]) >= config.n_layers]}
    for name in [n for n in mtp if n.endswith("_scale_inv")]:
        w = name.removesuffix("_scale_inv")
        mtp[w] = dequantize_blocks(mtp.pop(w), mtp.pop(name), config.fp8_block).to(dtype)
    return mtp


class MTPLayer(nn.Module):
    def __init__(self, config: ModelConfig, embed_tokens: nn.Embedding, has_indexer: bool = True):
        """config: the main model's; embed_tokens: the main model's embedding (shared)."""
        super().__init__()
        self.rope = Rope(config)
        config = mtp_config(config, has_indexer)
        self.config = config
        self.enorm = RMSNorm(config.hidden, config.rms_eps)
        self.hnorm = RMSNorm(config.hidden, config.rms_eps)
        self.eh_proj = Linear(2 * config.hidden, config.hidden)
        self.block = Block(config, 0)
        self.shared_head = SharedHead(config)
        self.embed_tokens = embed_tokens

    @classmethod
    def from_model(cls, main: GlmModel) -> "MTPLayer":
        """The first MTP layer of a loaded GLM model (from its `mtp_weights`)."""
        return cls.from_weights(main.config, main.mtp_weights, main.embed_tokens.weight, main.lm_head.weight)

    @classmethod
    def from_weights(cls, config: ModelConfig, weights: dict[str, torch.Tensor], embed: torch.Tensor,
                     lm_head: torch.Tensor) -> "MTPLayer":
        """The first MTP layer of `weights` (HF names, `model.layers.{n_layers}.*`; dequantised),
        sharing the main model's embedding (and its lm_head where the layer stores none), on
        their device and in their dtype. The PyTorch model and the CUDA decoders both build
        theirs here."""
        prefix = f"model.layers.{config.n_layers}."
        found = {k.removeprefix(prefix): v for k, v in weights.items() if k.startswith(prefix)}
        if not found:
            raise ValueError("this checkpoint has no MTP layer")
        embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        layer = cls(config, embed_tokens, has_indexer=any(k.startswith("self_attn.indexer.") for k in found))
        found.pop("embed_tokens.weight", None)  # a copy of the main embedding where stored
        found.setdefault("shared_head.head.weight", lm_head)
        own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")
        block, _ = normalise_weights({f"model.layers.0.{k}": v for k, v in found.items()
                                      if not k.startswith(own)}, 1)
        state = {k.replace("model.layers.0.", "block.", 1): v for k, v in block.items()}
        state.update({k: v for k, v in found.items() if k.startswith(own)})
        state["embed_tokens.weight"] = embed
        assign_strict(layer, state, embed.dtype)
        layer.embed_tokens = embed_tokens
        return layer.eval()

    def new_state(self, capacity: int = 1024):
        """The layer's own KV state (dense K/V, or MLA latents), beside the main model's."""
        weight = self.embed_tokens.weight
        return GlmModel.new_state(self, capacity, dtype=weight.dtype, device=weight.device)

    @torch.inference_mode()
    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, state) -> torch.Tensor:
        """hidden [T, H] (main model, normed) at positions state.num_tokens.., next_ids [T] the
        tokens after them -> logits [T, vocab] for the tokens after those."""
        t = hidden.shape[0]
        positions = torch.arange(state.num_tokens, state.num_tokens + t, device=hidden.device)
        x = self.eh_proj(torch.cat((self.enorm(self.embed_tokens(next_ids)), self.hnorm(hidden)), -1))
        x, _ = self.block(x, state, positions)
        state.commit(t)
        return self.shared_head.head(self.shared_head.norm(x))


@dataclasses.dataclass
class SpeculativeResult:
    token_ids: list[int]
    steps: int  # main-model forwards after prefill
    drafted: int
    accepted: int
    stop_reason: str
    decode_s: float  # prefill and decode

    @property
    def acceptance_length(self) -> float:
        """Tokens each main-model verify forward yields, its own prediction and the accepted
        draft (1.0 = no draft ever accepted, 2.0 = all); 0 when no step ran."""
        return (self.steps + self.accepted) / self.steps if self.steps else 0.0


class _Take:
    """The kept tokens: a stop token ends (not kept), so does the max_new-th token."""

    def __init__(self, max_new: int, stops: set[int]):
        self.max_new, self.stops, self.out, self.reason = max_new, stops, [], None

    def __call__(self, token: int) -> bool:
        if token in self.stops:
            self.reason = "stop"
            return True
        self.out.append(token)
        if len(self.out) >= self.max_new:
            self.reason = "length"
        return self.reason is not None


def speculative_decode(model: Callable, state, prompt: torch.Tensor, take: Callable[[int], bool], *,
                       mtp: MTPLayer | None, out: list[int], draft: Callable[[list[int]], int] | None = None,
                       chunk_size: int = 1024, on_chunk=None) -> tuple[int, int, int]:
    """Append `prompt` to `state` and decode greedily with drafts verified by the main model
    (the module docstring). take(token) -> True ends generation (the token is kept unless it is a
    stop token); `out` is the list take keeps (drafts are chosen from it). Returns (steps,
    drafted, accepted). The MTP layer runs over the prompt too (its own KV, in chunks) so its
    drafts see the whole prompt; a state that already held a prefix lends it none of that (the
    drafts see less context, the tokens are the main model's either way).

    model: a `GlmModel`, or what calls the CUDA decoders the same way (`Engine._hidden_forward`):
    model(ids, state, last_only=, chunk_size=, on_chunk=, return_hidden=True) -> (logits of the
    last or every row, normed final hidden states of every row), the rows committed to state."""
    device = prompt.device
    logits, hidden = model(prompt, state, last_only=True, chunk_size=chunk_size, on_chunk=on_chunk,
                           return_hidden=True)
    first = int(logits[-1].argmax())
    steps = drafted = accepted = 0
    if take(first):  # before the MTP layer's pass over the prompt: the first token is out at once
        return steps, drafted, accepted
    d = None
    mstate = None
    if mtp is not None:  # pairs (h_i, token i+1) for every prompt position
        mstate = mtp.new_state(capacity=state.num_tokens + take.max_new + 2)
        nxt = torch.cat((prompt[1:], torch.tensor([first], device=device)))
        for s in range(0, len(prompt), chunk_size):
            draft_logits = mtp(hidden[s:s + chunk_size], nxt[s:s + chunk_size], mstate)
        d = int(draft_logits[-1].argmax())
    last = first
    while True:
        if draft is not None:
            d = draft(list(out))
        n = state.num_tokens  # position of `last`
        logits, hidden = model(torch.tensor([last, d], device=device), state, return_hidden=True)
        steps += 1
        drafted += 1
        g1, g2 = int(logits[0].argmax()), int(logits[1].argmax())
        if g1 == d:  # the draft is the main model's own next token: keep it and the one after
            accepted += 1
            if take(d) or take(g2):
                return steps, drafted, accepted
            last = g2
            if mtp is not None:
                d = int(mtp(hidden, torch.tensor([d, g2], device=device), mstate)[-1].argmax())
        else:
            state.truncate(n + 1)  # drop the rejected draft's KV
            if take(g1):
                return steps, drafted, accepted
            last = g1
            if mtp is not None:
                d = int(mtp(hidden[:1], torch.tensor([g1], device=device), mstate)[-1].argmax())


def speculative_generate(model: GlmModel, prompt: Sequence[int], max_new_tokens: int, *,
                         mtp: MTPLayer | None = None, stop_ids: Sequence[int] = (),
                         draft: Callable[[list[int]], int] | None = None) -> SpeculativeResult:
    """Greedy decoding with MTP drafts verified by the main model, on a fresh state (see the
    module docstring); `Engine.generate` runs the same loop on its own state.

    draft(tokens so far) -> a draft token replaces the MTP layer (tests use it to force
    accepted and rejected drafts)."""
    if mtp is None and draft is None:
        mtp = MTPLayer.from_model(model)
    device = model.embed_tokens.weight.device
    state = model.new_state(len(prompt) + max_new_tokens + 2, device=device)
    take = _Take(max_new_tokens, set(stop_ids))
    t0 = time.perf_counter()
    steps, drafted, accepted = speculative_decode(model, state, torch.tensor(list(prompt), device=device), take,
                                                  mtp=mtp, out=take.out, draft=draft)
    return SpeculativeResult(take.out, steps, drafted, accepted, take.reason, time.perf_counter() - t0)
