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
"""

from __future__ import annotations

from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .config import CheckpointError

# Used when a checkpoint ships no template; ChatML is what most small instruct models use.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


REASONING_EFFORTS = ("low", "medium", "high")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _raise(message):
    raise TemplateError(message)


def render_chat(template: str | None, messages: list[dict[str, str]], *,
                bos_token: str | None = None, eos_token: str | None = None,
                add_generation_prompt: bool = True, enable_thinking: bool | None = None,
                reasoning_effort: str | None = None) -> str:
    # trim_blocks/lstrip_blocks as in transformers, which the templates are written against.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    extra = {}
    if enable_thinking is not None:
        extra["enable_thinking"] = enable_thinking
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning effort must be one of {', '.join(REASONING_EFFORTS)}")
        extra["reasoning_effort"] = reasoning_effort
    try:
        return env.from_string(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "", eos_token=eos_token or "", **extra)
    except TemplateError as e:
        raise CheckpointError(f"the model's chat template failed: {e}") from None


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
