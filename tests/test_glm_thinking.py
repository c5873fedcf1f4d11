"""Thinking controls: enable_thinking / reasoning_effort reach the chat template exactly as
transformers passes them, and a reasoning model's <think> text never becomes the answer (nor
what citations are parsed from), even though decoding drops the think tags themselves."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the reference extra is not installed")

from docqa.engine.chat import render_chat, split_thinking  # noqa: E402
from docqa.errors import DocqaError  # noqa: E402
from docqa.engine.tokenizer import Tokenizer  # noqa: E402
from docqa.pipelines.answer.citations import parse_citations  # noqa: E402
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
    with pytest.raises(DocqaError, match="low, medium, high"):
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
    assert [(c.span.page, c.span.line_start) for c in parse_citations(text)] == [(3, 4)]


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


# -- the switches through the CLI ------------------------------------------------------------

def tiny_glm_dir(path, template: str = GLM_TEMPLATE):
    """A tiny random GLM-4 checkpoint (transformers) with the GLM tokenizer and `template`."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config("glm4", vocab_size=272))
    model.eval()
    model.save_pretrained(path)
    write_glm_tokenizer(path)
    (path / "chat_template.jinja").write_text(template)
    return model


def _generate_cli(*args):
    from typer.testing import CliRunner

    from docqa.app.cli import app

    return CliRunner().invoke(app, ["engine", "generate", *args])


@pytest.mark.parametrize("flags,kw", [((), {}), (("--no-thinking",), {"enable_thinking": False}),
                                      (("--reasoning-effort", "high"), {"reasoning_effort": "high"})])
def test_engine_generate_switches_match_transformers(tmp_path, flags, kw):
    """`docqa engine generate --chat` with the switches: the prompt is transformers' own
    apply_chat_template with the same arguments, and the tokens its greedy generate."""
    import json

    model = tiny_glm_dir(tmp_path, EFFORT_TEMPLATE)
    ref = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    want_prompt = ref.apply_chat_template(CHAT, add_generation_prompt=True, **kw)
    want_prompt = want_prompt["input_ids"] if hasattr(want_prompt, "keys") else want_prompt
    r = _generate_cli(CHAT[0]["content"], "--chat", "-n", "6", "--model", str(tmp_path), "--json", *flags)
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["prompt_tokens"] == len(want_prompt)
    with torch.no_grad():
        want = model.generate(torch.tensor([want_prompt]), max_new_tokens=6, do_sample=False,
                              eos_token_id=None)[0, len(want_prompt):].tolist()
    assert got["token_ids"] == want[:len(got["token_ids"])]
    assert got["stop_reason"] == "stop" or len(got["token_ids"]) == 6


def test_switches_a_template_cannot_take_are_one_line_errors(tmp_path):
    tiny_glm_dir(tmp_path)  # GLM_TEMPLATE: enable_thinking, no reasoning_effort
    r = _generate_cli("Hi", "--chat", "--model", str(tmp_path), "--reasoning-effort", "high")
    assert r.exit_code == 1
    assert r.stderr.strip() == "error: this model's chat template has no reasoning effort setting; " \
                               "leave out --reasoning-effort"
    r = _generate_cli("Hi", "--model", str(tmp_path), "--no-thinking")
    assert r.exit_code == 2 and "add --chat" in r.output
    r = _generate_cli("Hi", "--chat", "--model", str(tmp_path), "--reasoning-effort", "extreme")
    assert r.exit_code == 2


def test_check_switches_on_templates_without_them():
    from docqa.engine.chat import CHATML, CheckpointError, check_switches

    check_switches(CHATML, False, None)  # never thinks: --no-thinking holds already
    r1 = "{{ messages[0]['content'] }}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
    with pytest.raises(CheckpointError, match="no switch to turn thinking off"):
        check_switches(r1, False, None)  # thinks (opens the block itself) with no way to stop it
    with pytest.raises(CheckpointError, match="no reasoning effort"):
        check_switches(CHATML, None, "low")
    with pytest.raises(DocqaError, match="give one of them"):
        check_switches(EFFORT_TEMPLATE, False, "low")
    check_switches(EFFORT_TEMPLATE, True, "low")


def test_ask_and_review_pass_the_switches(tmp_path):
    """`docqa ask --no-thinking` prompts with transformers' enable_thinking=False rendering (its
    prompt is longer by exactly the empty think block); `review --reasoning-effort` on a
    template without it stops before answering anything."""
    import json

    from typer.testing import CliRunner

    from docqa.app.cli import app
    from docqa.fixtures.make_pdf import write_sample_contract_pdf

    ckpt = tmp_path / "glm"
    ckpt.mkdir()
    tiny_glm_dir(ckpt)
    ref = transformers.AutoTokenizer.from_pretrained(str(ckpt))

    def n(**kw):
        ids = ref.apply_chat_template(CHAT, add_generation_prompt=True, **kw)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    pdf = write_sample_contract_pdf(tmp_path / "c.pdf")
    db = str(tmp_path / "d.db")
    assert CliRunner().invoke(app, ["ingest", str(pdf), "--db", db]).exit_code == 0
    prompts = []
    for flags in ((), ("--no-thinking",)):
        r = CliRunner().invoke(app, ["ask", str(pdf), "Which law governs?", "--db", db, "--json", "--model",
                                     str(ckpt), "--max-tokens", "4", "--free-text", *flags])
        assert r.exit_code == 0, r.output
        prompts.append(json.loads(r.stdout)["timings"]["prompt_tokens"])
    assert prompts[1] - prompts[0] == n(enable_thinking=False) - n()
    r = CliRunner().invoke(app, ["review", str(pdf), "--checklist", "contract_review", "--db", db,
                                 "--model", str(ckpt), "--reasoning-effort", "low"])
    assert r.exit_code == 1
    assert "no reasoning effort setting" in r.stderr and "answered" not in r.stderr


# -- thinking before a constrained answer -----------------------------------------------------

def test_think_first_then_the_answer_chooser(tmp_path):
    """ThinkFirst lets the model think (its own argmax) and hands over at </think>, at a stop
    token or at the budget; the answer chooser sees every generated id. Driven through
    Engine.generate with the model's logits replaced by a script."""
    from docqa.engine import Engine
    from docqa.engine.chat import ThinkFirst

    tiny_glm_dir(tmp_path)
    engine = Engine.load(tmp_path, device="cpu")
    tok = engine.tokenizer
    think, close = tok.tok.token_to_id("<think>"), tok.tok.token_to_id("</think>")
    thought = tok.encode("clause 9", add_bos=False)
    prompt = engine.chat_prompt("Which law governs?")

    def run(script, budget, answer_ids):
        seen = []

        def answer(logits, out):
            seen.append(len(out))
            return answer_ids[len(seen) - 1]

        first = ThinkFirst(answer, tok, prompt, budget)

        def choose(logits, out):
            fake = torch.zeros_like(logits)
            fake[script[len(out)] if len(out) < len(script) else 0] = 1.0
            return first(fake, out)

        res = engine.generate(prompt, len(answer_ids) + budget, stop_ids=tok.stop_ids, choose=choose)
        return res, seen

    answer_ids = tok.encode("Delaware", add_bos=False) + [tok.eos_id]
    res, seen = run([think, *thought, close], 50, answer_ids)
    assert res.thinking == "clause 9" and res.text == "Delaware"
    assert seen[0] == len(thought) + 2  # the answer chooser starts after </think>, counting it
    # the budget closes the block (the script would think on)
    res, _ = run([think] + thought * 20, 4, answer_ids)
    assert res.token_ids[:4] == [think, *thought[:2], close] and res.text == "Delaware"
    # a stop token inside the block closes it instead of ending the generation
    res, _ = run([think, thought[0], tok.eos_id], 50, answer_ids)
    assert res.token_ids[:3] == [think, thought[0], close] and res.text == "Delaware"
    # no <think> first: the answer chooser from the first token
    res, seen = run([thought[0]], 50, answer_ids)
    assert seen[0] == 0 and res.thinking == "" and res.text == "Delaware"


def test_gemma_turns_for_a_gguf_without_template():
    """A checkpoint with no chat template gets the turn format of its vocabulary: Gemma's
    (written out by hand from Gemma's published format: no system role, the system text opens
    the first user turn, the assistant is "model"), else ChatML."""
    from tokenizers import Tokenizer as HFTokenizer, models

    from docqa.engine.chat import CHATML, template_of

    def tok(specials):
        t = HFTokenizer(models.WordLevel({"<unk>": 0, "<bos>": 1}, unk_token="<unk>"))
        t.add_special_tokens(specials)
        return Tokenizer(t, bos_id=1, eos_id=None)

    gemma = tok(["<start_of_turn>", "<end_of_turn>"])
    messages = [{"role": "system", "content": "Cite pages."}, {"role": "user", "content": "Which law? "},
                {"role": "assistant", "content": "Delaware."}, {"role": "user", "content": "And venue?"}]
    assert render_chat(template_of(gemma), messages, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nCite pages.\n\nWhich law?<end_of_turn>\n"
        "<start_of_turn>model\nDelaware.<end_of_turn>\n"
        "<start_of_turn>user\nAnd venue?<end_of_turn>\n<start_of_turn>model\n")
    assert template_of(tok(["<|im_start|>"])) == CHATML
