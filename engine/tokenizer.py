"""Tokenizers through the `tokenizers` library: tokenizer.json for HF dirs, rebuilt from GGUF
metadata for GGUF files: byte-level BPE (`tokenizer.ggml.model == "gpt2"`) and SentencePiece
BPE (`"llama"`: Llama 2, Mistral, Gemma), the latter as transformers' GGUF loader rebuilds it
(merges recovered from the vocabulary, byte fallback; tests/test_gguf_sentencepiece.py)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .config import CheckpointError

_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer regexes, keyed by llama.cpp's `tokenizer.ggml.pre` names.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {name: _LLAMA3_SPLIT for name in
           ("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx", "pixtral")}
_SPLITS.update({name: _QWEN2_SPLIT for name in ("qwen2", "deepseek-r1-qwen", "megrez")})
# Vocabularies trained on GPT-2's own regex, some with every digit split off first.
_GPT2_STYLE = {"default", "gpt2", "starcoder", "refact", "olmo", "jais", "gpt-2"}
_GPT2_DIGITS = {"smollm"}


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


class Tokenizer:
    def __init__(self, tok: HFTokenizer, *, bos_id: int | None, eos_id: int | None,
                 add_bos: bool = False, chat_template: str | None = None,
                 extra_stop_ids: tuple[int, ...] = ()):
        self.tok = tok
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.chat_template = chat_template
        self.stop_ids = tuple(dict.fromkeys(i for i in (eos_id, *extra_stop_ids) if i is not None))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def token_text(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tok.id_to_token(token_id)

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, *, skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_hf_dir(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.exists():
            raise CheckpointError(f"{path} has no tokenizer.json")
        tok = HFTokenizer.from_file(str(file))
        cfg: dict[str, Any] = {}
        if (path / "tokenizer_config.json").exists():
            cfg = json.loads((path / "tokenizer_config.json").read_text())

        def special_id(key):
            value = cfg.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            return tok.token_to_id(value) if value else None

        gen_eos = None
        gen_file = path / "generation_config.json"
        if gen_file.exists():
            gen_eos = json.loads(gen_file.read_text()).get("eos_token_id")
        extra = tuple(gen_eos) if isinstance(gen_eos, list) else ((gen_eos,) if gen_eos is not None else ())
        template = cfg.get("chat_template")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text()
        if isinstance(template, list):  # several named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        bos_id = special_id("bos_token")
        # Llama 3 style files add BOS through tokenizer.json's post-processor, not a config flag.
        add_bos = bool(cfg.get("add_bos_token", False)) or (
            bos_id is not None and tok.encode("a", add_special_tokens=True).ids[:1] == [bos_id])
        return cls(tok, bos_id=bos_id, eos_id=special_id("eos_token"),
                   add_bos=add_bos, chat_template=template,
                   extra_stop_ids=extra + _chat_end_ids(tok))

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> "Tokenizer":
        kind = meta.get("tokenizer.ggml.model")
        if kind == "llama":
            return _sentencepiece_from_gguf(meta)
        if kind != "gpt2":
            raise CheckpointError(
                f"GGUF tokenizer type {kind!r} is not supported yet (byte-level BPE 'gpt2' and "
                "SentencePiece 'llama' are); use the model's Hugging Face directory instead")
        tokens: list[str] = meta["tokenizer.ggml.tokens"]
        types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alphabet = _byte_alphabet()
        spelled = set(alphabet.values())
        # Vocab entries are already in GPT-2's byte alphabet; the odd one that is not (a
        # mislabelled control token) is re-spelled so the BPE model can still hold it.
        vocab = {}
        for i, t in enumerate(tokens):
            key = t if set(t) <= spelled else "".join(alphabet[b] for b in t.encode("utf-8"))
            vocab.setdefault(key, i)
        merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
        tok = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        pre = meta.get("tokenizer.ggml.pre", "default")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _SPLITS:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif pre in _GPT2_DIGITS:
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            # GPT-2's regex is what llama.cpp falls back to for the names it does not know either.
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        control = [AddedToken(t, special=True, normalized=False)
                   for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= spelled]
        user = [AddedToken(t, special=False, normalized=False)
                for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
        tok.add_special_tokens(control)
        tok.add_tokens(user)
        return cls(tok, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                   eos_id=meta.get("tokenizer.ggml.eos_token_id"),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=meta.get("tokenizer.chat_template"),
                   extra_stop_ids=_chat_end_ids(tok))


def _spm_merges(tokens: list[str], vocab: dict[str, int], rank: dict[str, float]) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies: every split of a token into two
    tokens, best rank first (ties: longer left part, then longer right part, then file order;
    within one token by the parts' ids) — the order transformers derives them in."""
    found = []
    for piece in dict.fromkeys(tokens):
        pairs = [(piece[:i], piece[i:]) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        pairs.sort(key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))
        found += [(left, right, rank[piece]) for left, right in pairs]
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _sentencepiece_from_gguf(meta: dict[str, Any]) -> "Tokenizer":
    """SentencePiece BPE with byte fallback from GGUF metadata (`tokenizer.ggml.model ==
    "llama"`). Llama/Mistral: a "▁" prepended to the text (Metaspace), merges ranked by the
    file's scores. Gemma: spaces become "▁" with nothing prepended, whitespace-only tokens are
    stored as real spaces (respelled as "▁"s), and the merge order is the file's token order
    (Gemma's scores do not follow it)."""
    arch = meta.get("general.architecture", "")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    gemma = arch.startswith("gemma")
    if gemma:
        tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
        rank = {t: -i for i, t in enumerate(tokens)}  # a repeated token ranks at its last place
    else:
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        rank = {}
        for t, sc in zip(tokens, scores):
            rank[t] = sc  # as a dict built from the pairs: the last duplicate wins
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab[t] = i
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]] \
        if "tokenizer.ggml.merges" in meta else _spm_merges(tokens, vocab, rank)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = HFTokenizer(models.BPE(vocab, merges, fuse_unk=True, byte_fallback=True,
                                 unk_token=tokens[unk] if gemma and unk is not None else None))
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                     split=False)
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == _USER_DEFINED])
    return Tokenizer(tok, bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                     eos_id=meta.get("tokenizer.ggml.eos_token_id"),
                     add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", True)),
                     chat_template=meta.get("tokenizer.chat_template"),
                     extra_stop_ids=_chat_end_ids(tok))


class TextStream:
    """Text deltas of a growing list of generated ids, for streaming to a terminal.

    Decoding all ids again for every new token costs O(n) per token; this decodes a short tail
    instead: the ids from the last point where the text was complete. The tail is decoded
    twice (with and without the newest ids) and the difference is the delta, so decoders that
    treat a sequence's first token specially (a leading space dropped) agree on both sides.
    A delta is held back ("") while the newest ids end inside a multi-byte character; the
    deltas joined are the text of all ids (tests/test_engine_generate.py).
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0  # decoding starts here: the text before it is final
        self.shown = 0  # ids up to here have been turned into text already

    def push(self, token: int) -> str:
        self.ids.append(token)
        done = self.tokenizer.decode(self.ids[self.start:self.shown])
        now = self.tokenizer.decode(self.ids[self.start:])
        if now.endswith("\ufffd"):
            return ""
        self.start, self.shown = self.shown, len(self.ids)
        return now[len(done):]


def _chat_end_ids(tok: HFTokenizer) -> tuple[int, ...]:
    """End-of-turn tokens of the common chat formats: generation must stop there even when the
    file's eos is another token (Llama 3's <|eot_id|>, ChatML's <|im_end|>)."""
    ids = (tok.token_to_id(t) for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"))
    return tuple(i for i in ids if i is not None)
