"""Per-document prefix cache: reuse, isolation between documents/settings/models, disk tier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from docqa.engine.dense import DenseKVState
from docqa.engine.prefix_cache import PrefixCache
from docqa.engine.rope import Rope
from docqa.engine.settings import EngineSettings

from test_sparse_attention import CFG, SMALL, rel_err, tiny_model

SETTINGS = EngineSettings(top_k=64, **SMALL)  # budget covers these contexts: exact vs dense
SEG = SETTINGS.segment_size
# fp32 logits after two layers, prefix computed in other chunks than the reference: ~1e-5
# noise; a foreign or stale KV segment moves logits by O(1).
TOL = 1e-4


class Counting:
    """Wraps a KVState and counts the tokens the model pushes through it (prefill work)."""

    def __init__(self, state):
        self.state, self.tokens = state, 0

    @property
    def num_tokens(self):
        return self.state.num_tokens

    def attend(self, layer, q, k, v, positions):
        if layer == 0:
            self.tokens += q.shape[0]
        return self.state.attend(layer, q, k, v, positions)

    def commit(self, n):
        self.state.commit(n)

    def truncate(self, n):
        self.state.truncate(n)


def ids(n, seed):
    return torch.randint(0, CFG.vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def dense_logits(model, prompt):
    return model(torch.tensor(prompt), DenseKVState(CFG, Rope(CFG)), last_only=True)


def ask(model, cache, doc_key, prompt):
    """Logits of the prompt's last token, prefilling only what the cache lacks."""
    state, cached = cache.get_state(doc_key, prompt)
    counting = Counting(state)
    logits = model(torch.tensor(prompt[cached:]), counting, last_only=True, chunk_size=100)
    cache.save(doc_key, prompt, state)
    return logits, cached, counting.tokens, state


def test_second_question_prefills_only_the_question(tmp_path):
    model, doc = tiny_model(), ids(400, 1)
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path)
    q1, q2 = doc + ids(20, 2), doc + ids(25, 3)
    l1, cached1, work1, _ = ask(model, cache, "doc-1", q1)
    assert cached1 == 0 and work1 == len(q1)
    l2, cached2, work2, _ = ask(model, cache, "doc-1", q2)
    # What the two prompts share, counted here: the cache reuses every full segment of it
    # (segments are its unit) and the model prefills exactly the rest, nothing twice.
    shared = next(i for i, (a, b) in enumerate(zip(q1, q2)) if a != b)
    assert shared >= len(doc) >= 2 * SEG  # the test reuses more than one segment
    assert cached2 == shared // SEG * SEG
    assert work2 == len(q2) - cached2
    assert rel_err(l1, dense_logits(model, q1)) < TOL
    assert rel_err(l2, dense_logits(model, q2)) < TOL


SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from test_sparse_attention import CFG, tiny_model
from test_prefix_cache import SETTINGS, Counting
from docqa.engine.prefix_cache import PrefixCache
prompt = json.loads(sys.argv[3])
model = tiny_model()
cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=sys.argv[2])
state, cached = cache.get_state("doc-1", prompt)
counting = Counting(state)
logits = model(torch.tensor(prompt[cached:]), counting, last_only=True)
print(json.dumps({"cached": cached, "work": counting.tokens, "disk_hits": cache.hits_disk,
                  "logits": logits[0].tolist()}))
"""


def test_another_process_reuses_the_disk_tier(tmp_path):
    model, doc = tiny_model(), ids(300, 4)
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path / "kv")
    ask(model, cache, "doc-1", doc + ids(10, 5))
    prompt = doc + ids(12, 6)
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    tests_dir = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, str(script), tests_dir, str(tmp_path / "kv"), json.dumps(prompt)],
                         capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout)
    assert got["cached"] == 2 * SEG and got["disk_hits"] == 2
    assert got["work"] == len(prompt) - 2 * SEG
    assert rel_err(torch.tensor(got["logits"]), dense_logits(model, prompt)[0]) < TOL


def test_documents_sharing_a_prefix_never_share_kv(tmp_path):
    model = tiny_model()
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path)
    common = ids(200, 7)
    a = common + ids(200, 8)  # same first segment, different second one
    b = common + ids(200, 9)
    ask(model, cache, "doc-a", a)
    # Another document key: nothing, even for identical tokens.
    _, cached, _, _ = ask(model, cache, "doc-b", a)
    assert cached == 0
    # Same document key, tokens that differ in the second segment: only the first is reused.
    lb, cached, _, _ = ask(model, cache, "doc-a", b)
    assert cached == SEG
    assert rel_err(lb, dense_logits(model, b)) < TOL
    # And a's cache still answers a exactly.
    la, cached, _, _ = ask(model, cache, "doc-a", a)
    assert cached == 3 * SEG and rel_err(la, dense_logits(model, a)) < TOL


def test_settings_and_models_never_share(tmp_path):
    model, prompt = tiny_model(), ids(300, 10)
    ask(model, PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path), "doc-1", prompt)
    assert PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path).get_state("doc-1", prompt)[1] == 2 * SEG
    other_settings = [EngineSettings(top_k=64, positions="true", **SMALL),
                      EngineSettings(top_k=64, kv_dtype="bfloat16", **SMALL),
                      EngineSettings(top_k=64, **{**SMALL, "block_size": 32})]
    for s in other_settings:
        assert PrefixCache.for_config(CFG, "model-a", s, cache_dir=tmp_path).get_state("doc-1", prompt)[1] == 0
    assert PrefixCache.for_config(CFG, "model-b", SETTINGS, cache_dir=tmp_path).get_state("doc-1", prompt)[1] == 0


def test_appends_and_truncation_never_corrupt_the_cached_copy(tmp_path):
    model, doc = tiny_model(), ids(300, 11)
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path)
    ask(model, cache, "doc-1", doc)
    state, cached = cache.get_state("doc-1", doc + [1])
    assert cached == 2 * SEG
    state.truncate(SEG + 10)  # into a cached segment: the state must write into its own copy
    model(torch.tensor(ids(200, 12)), state)
    prompt = doc + ids(9, 13)
    logits, cached, _, _ = ask(model, cache, "doc-1", prompt)
    assert cached == 2 * SEG and rel_err(logits, dense_logits(model, prompt)) < TOL


def test_lru_across_documents_and_reload_from_disk(tmp_path):
    model = tiny_model()
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path, memory_segments=2)
    docs = {f"doc-{i}": ids(300, 20 + i) for i in range(3)}
    for key, doc in docs.items():
        ask(model, cache, key, doc + [5])
    assert len(cache._memory) == 2  # the oldest document left memory...
    prompt = docs["doc-0"] + [7, 8]
    logits, cached, _, _ = ask(model, cache, "doc-0", prompt)
    assert cached == 2 * SEG and cache.hits_disk >= 2  # ...and came back from disk
    assert rel_err(logits, dense_logits(model, prompt)) < TOL
    # A disk budget of one segment keeps only the most recently used file(s).
    small = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path, disk_bytes=1)
    small._trim_disk()
    assert len(list(tmp_path.glob("*/*.safetensors"))) == 0


def test_a_hit_rechecks_namespace_and_token_ids(tmp_path):
    """A file found under the expected hash but written for other tokens or another document
    (a collision, a copied cache folder) is a miss, not foreign K/V."""
    from docqa.engine.prefix_cache import chain_hashes

    model = tiny_model()
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path)
    a, b = ids(200, 30), ids(200, 31)
    ask(model, cache, "doc-a", a)
    (src,) = list(tmp_path.glob("*/*.safetensors"))
    for key, prompt in (("doc-b", b), ("doc-a", b), ("doc-b", a)):
        target = cache._path(chain_hashes(cache.namespace(key), prompt[:SEG], SEG)[0])
        if target != src:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
        fresh = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path)
        assert fresh.get_state(key, prompt)[1] == 0, key
    assert PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=tmp_path).get_state("doc-a", a)[1] == SEG
