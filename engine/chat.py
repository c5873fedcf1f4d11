"""Chat prompts from the checkpoint's own jinja template, rendered in a sandbox (a template is
code shipped inside a model file)."""

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


def _raise(message):
    raise TemplateError(message)


def render_chat(template: str | None, messages: list[dict[str, str]], *,
                bos_token: str | None = None, eos_token: str | None = None,
                add_generation_prompt: bool = True) -> str:
    # trim_blocks/lstrip_blocks as in transformers, which the templates are written against.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "", eos_token=eos_token or "")
    except TemplateError as e:
        raise CheckpointError(f"the model's chat template failed: {e}") from None
