"""Thinking controls: enable_thinking / reasoning_effort reach the chat template exactly as
transformers passes them, and a reasoning model's <think> text never becomes the answer (nor
what citations are parsed from), even though decoding drops the think tags themselves."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from docqa.engine.chat import render_chat, split_thinking  # noqa: E402
from docqa.engine.tokenizer import Tokenizer  # noqa: E402
from docqa.pipelines.citations import parse_citations  # noqa: E402
from test_glm import GLM_TEMPLATE, tiny_config, write_glm_tokenizer  # noqa: E402

EFFORT_TEMPLATE = ("{% if reasoning_effort is defined %}<|system|>\nReasoning: {{ reasoning_effort }}"
                   "{% endif %}" + GLM_TEMPLATE)
CHAT = [{"role": "user", "content": "Which law governs?"}]


@pytest.mark.parametrize("kw", [{}, {"enable_thinking": False}, {"enable_thinking": True},
                                {"reasoning_effort": "high", "enable_thinking": True}])
def test_template_options_render_as_transformers(tmp_path, kw):
    write_glm_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(EFFORT_TEMPLATE)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = Tokenizer.from_hf_dir(tmp_path)
    want = ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, **kw)
    assert render_chat(ours.chat_template, CHAT, **kw) == want
    if kw.get("enable_thinking") is False:
        assert want.endswith("<|assistant|>\n<think></think>")


def test_reasoning_effort_is_checked():
    with pytest.raises(ValueError, match="low, medium, high"):
        render_chat(GLM_TEMPLATE, CHAT, reasoning_effort="extreme")


def test_split_thinking_by_token_ids(tmp_path):
    write_glm_tokenizer(tmp_path)
    tok = Tokenizer.from_hf_dir(tmp_path)
    think, close = tok.tok.token_to_id("<think>"), tok.tok.token_to_id("</think>")
    thought = tok.encode("Clause 9 [PAGE:1, LINE:2] looks relevant.", add_bos=False)
    answer = tok.encode("Delaware law [PAGE:3, LINE:4].", add_bos=False)
    # The tags are special: plain decoding runs thinking and answer together.
    assert "Clause 9" in tok.decode([think, *thought, close, *answer])
    assert split_thinking([think, *thought, close, *answer], tok) == (
        "Clause 9 [PAGE:1, LINE:2] looks relevant.", "Delaware law [PAGE:3, LINE:4].")
    # Template opened the block: the output starts inside it.
    assert split_thinking([*thought, close, *answer], tok)[1] == "Delaware law [PAGE:3, LINE:4]."
    # Stopped while still thinking: no answer at all.
    assert split_thinking([think, *thought], tok)[1] == ""
    # No think tokens: all answer.
    assert split_thinking(answer, tok) == ("", "Delaware law [PAGE:3, LINE:4].")
    _, text = split_thinking([think, *thought, close, *answer], tok)
    assert [(c.page, c.line_start) for c in parse_citations(text)] == [(3, 4)]


def test_engine_keeps_thinking_out_of_the_answer(tmp_path):
    """A GLM engine whose decoding is steered (choose) through a think block: the result's text
    is the answer alone, its thinking the rest; chat_prompt passes the switches."""
    from docqa.engine import Engine

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("glm4", vocab_size=272))
    model.save_pretrained(tmp_path)
    write_glm_tokenizer(tmp_path)
    engine = Engine.load(tmp_path, device="cpu")
    tok = engine.tokenizer
    off = engine.chat_prompt("Which law governs?", thinking=False)
    assert tok.decode(off, skip_special=False).endswith("<|assistant|>\n<think></think>")
    script = [tok.tok.token_to_id("<think>"), *tok.encode("Check clause 9 [PAGE:1, LINE:2].", add_bos=False),
              tok.tok.token_to_id("</think>"), *tok.encode("Delaware [PAGE:3, LINE:4]", add_bos=False)]
    result = engine.generate(engine.chat_prompt("Which law governs?"), len(script), stop_ids=(),
                             choose=lambda logits, out: script[len(out)])
    assert result.token_ids == script
    assert result.text == "Delaware [PAGE:3, LINE:4]"
    assert result.thinking == "Check clause 9 [PAGE:1, LINE:2]."
