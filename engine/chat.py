"""Chat prompts from the checkpoint's own jinja template, rendered in a sandbox (a template is
code shipped inside a model file), and the thinking controls of reasoning models.

Thinking. GLM-4.5+ (and Qwen3, DeepSeek-R1 style models) write their reasoning between <think>
and </think> before the answer; their templates take `enable_thinking` (False: an empty think
block is written into the prompt so the model answers at once) and some `reasoning_effort`.
`render_chat` passes both only when set, so templates that test `is defined` keep their own
defaults. `split_thinking` separates a generation's ids into thinking and answer *by token id*
(the think tags are special tokens that decoding drops, so the text alone cannot tell where
thinking ends): everything before the last </think> — or all of it while a think block is still
open — is thinking and never part of the answer (nor of what citations are parsed from).

The switches are checked against the template (`check_switches`): --reasoning-effort on a
template that has no such variable is an error (it would be silently ignored), and so is
--no-thinking on a template that writes think blocks but has no `enable_thinking`; on a model
that never thinks (no think tags in its template) --no-thinking is a no-op, since what it asks
for already holds.
"""

from __future__ import annotations

from datetime import datetime

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import DocqaError
from .config import CheckpointError

# Used when a checkpoint ships no template; ChatML is what most small instruct models use.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Gemma's turn format, for Gemma GGUFs that ship no template (the Gemma 3 270M file does not):
# no system role, so a system message opens the first user turn; the assistant is "model".
GEMMA = (
    "{{ bos_token }}{% set sys = messages[0]['content'] + '\n\n' if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{{ (sys if loop.first else '') + m['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def template_of(tokenizer) -> str:
    """The checkpoint's own chat template, else the turn format its vocabulary was trained on."""
    if tokenizer.chat_template:
        return tokenizer.chat_template
    return GEMMA if tokenizer.tok.token_to_id("<start_of_turn>") is not None else CHATML


REASONING_EFFORTS = ("low", "medium", "high")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _raise(message):
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    # trim_blocks/lstrip_blocks as in transformers, which the templates are written against.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def check_switches(template: str | None, enable_thinking: bool | None, reasoning_effort: str | None) -> None:
    """Raise a one-line CheckpointError when the template cannot honour the thinking switches
    asked for (see the module docstring); None means not asked."""
    if enable_thinking is None and reasoning_effort is None:
        return
    if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
        raise DocqaError(f"reasoning effort must be one of {', '.join(REASONING_EFFORTS)}")
    if enable_thinking is False and reasoning_effort is not None:
        raise DocqaError("a reasoning effort asks for thinking, which --no-thinking turns off: give one of them")
    template = template or CHATML
    try:
        names = meta.find_undeclared_variables(_environment().parse(template))
    except TemplateError as e:
        raise CheckpointError(f"the model's chat template failed: {e}") from None
    if reasoning_effort is not None and "reasoning_effort" not in names:
        raise CheckpointError("this model's chat template has no reasoning effort setting; "
                              "leave out --reasoning-effort")
    if enable_thinking is False and "enable_thinking" not in names and THINK_OPEN in template:
        raise CheckpointError("this model's chat template has no switch to turn thinking off "
                              "(no enable_thinking); leave out --no-thinking")


def render_chat(template: str | None, messages: list[dict[str, str]], *,
                bos_token: str | None = None, eos_token: str | None = None,
                add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                reasoning_effort: str | None = None) -> str:
    check_switches(template, enable_thinking, reasoning_effort)
    env = _environment()
    extra = {}
    if enable_thinking is not None:
        extra["enable_thinking"] = enable_thinking
    if reasoning_effort is not None:
        extra["reasoning_effort"] = reasoning_effort
    try:
        return env.from_string(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "", eos_token=eos_token or "", **extra)
    except TemplateError as e:
        raise CheckpointError(f"the model's chat template failed: {e}") from None


def split_prompt(tokenizer, messages: list[dict[str, str]], slot: str, fill: str, *,
                 enable_thinking: bool | None = None, reasoning_effort: str | None = None) -> tuple[list[int], list[int]]:
    """A chat prompt as (prefix ids, rest ids), cut where `slot` stands in `messages` and with
    `fill` in its place. The prefix is everything the template renders before the slot, the
    same whatever the fill: what a per-document prefix cache stores (`ask --read-all` puts the
    document before the slot and the question in it)."""
    text = render_chat(template_of(tokenizer), messages, bos_token=tokenizer.token_text(tokenizer.bos_id),
                       eos_token=tokenizer.token_text(tokenizer.eos_id), enable_thinking=enable_thinking,
                       reasoning_effort=reasoning_effort)
    head, tail = text.split(slot)
    return tokenizer.encode(head, add_bos=False), tokenizer.encode(fill + tail, add_bos=False)


def split_thinking(ids: list[int], tokenizer) -> tuple[str, str]:
    """(thinking text, answer text) of generated token ids.

    Models without think tokens: ("", all of it). A </think> ends the thinking (the last one
    wins); a <think> with no </think> after it means the model was still thinking when it
    stopped, so there is no answer yet. Prompts that open the block themselves (the model's
    output then starts inside it) are covered by the first rule."""
    open_id = tokenizer.tok.token_to_id(THINK_OPEN)
    close_id = tokenizer.tok.token_to_id(THINK_CLOSE)
    ids = list(ids)
    if close_id is not None and close_id in ids:
        end = len(ids) - 1 - ids[::-1].index(close_id)
        thought = [i for i in ids[:end] if i != open_id]
        return tokenizer.decode(thought).strip(), tokenizer.decode(ids[end + 1:]).lstrip()
    if open_id is not None and open_id in ids:
        start = ids.index(open_id)
        return tokenizer.decode(ids[start + 1:]).strip(), tokenizer.decode(ids[:start]).strip()
    return "", tokenizer.decode(ids)


def think_ids(tokenizer) -> tuple[int, int] | None:
    """The (<think>, </think>) token ids of a reasoning model's vocabulary, else None."""
    ids = tokenizer.tok.token_to_id(THINK_OPEN), tokenizer.tok.token_to_id(THINK_CLOSE)
    return None if None in ids else ids


def opens_thinking(tokenizer, prompt_ids) -> bool:
    """Does the prompt leave a think block open (templates that write <think> themselves, so the
    output starts inside it)?"""
    tags = think_ids(tokenizer)
    if tags is None:
        return False
    ids = list(prompt_ids)
    last = {t: len(ids) - 1 - ids[::-1].index(t) if t in ids else -1 for t in tags}
    return last[tags[0]] > last[tags[1]]


class ThinkingTracker:
    """Which generated tokens are thinking, token by token as they stream (the think tags
    themselves count as thinking): for streaming the answer apart from the thinking; the final
    split is `split_thinking`'s."""

    def __init__(self, tokenizer, prompt_ids):
        self.tags = think_ids(tokenizer)
        self.inside = opens_thinking(tokenizer, prompt_ids)

    def __call__(self, token_id: int) -> bool:
        if self.tags is None:
            return False
        if token_id == self.tags[0]:
            self.inside = True
        elif token_id == self.tags[1]:
            self.inside = False
            return True
        return self.inside


class ThinkFirst:
    """A token chooser for `Engine.generate(choose=...)` that lets a reasoning model think
    before `answer` chooses: the model may open a think block at its first token (or the prompt
    opened one), inside it takes its own argmax, and the block is closed when the model closes
    it, would stop, or reaches `budget` generated tokens; from then on `answer` (the quote
    decoder, or argmax) chooses, seeing all generated ids (so its token count includes the
    thinking). Without think tokens in the vocabulary it is `answer` alone."""

    def __init__(self, answer, tokenizer, prompt_ids, budget: int):
        self.answer, self.budget = answer, budget
        self.tags = think_ids(tokenizer)
        self.stops = set(tokenizer.stop_ids)
        self.inside = opens_thinking(tokenizer, prompt_ids)
        self.answering = self.tags is None

    def __call__(self, logits, generated) -> int:
        if not self.answering:
            token = int(logits.argmax())
            if not self.inside and not generated and token == self.tags[0]:
                self.inside = True
                return token
            if not self.inside:
                self.answering = True
            elif token == self.tags[1] or token in self.stops or len(generated) + 1 >= self.budget:
                self.inside, self.answering = False, True
                return self.tags[1]
            else:
                return token
        return self.answer(logits, generated)
