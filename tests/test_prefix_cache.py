"""Per-document prefix cache: reuse, isolation between documents/settings/models, disk tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
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


# --- an unusable cache location, and concurrent use -------------------------------------------

@pytest.mark.parametrize("where", ["cache home is a file", "kv folder read-only"])
def test_an_unusable_cache_location_warns_once_and_answers(tmp_path, monkeypatch, caplog, where):
    """The cache is an optimisation: where its files cannot be written, the answer still comes
    (the logits a cache-less prefill gives), with one warning, and later questions still reuse
    the segments held in memory."""
    if where == "cache home is a file":
        (tmp_path / "home").write_text("not a folder")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders (the case above takes the same path)")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
        kv = tmp_path / "home" / "docqa" / "kv"
        kv.mkdir(parents=True)
        kv.chmod(0o555)
    model, doc = tiny_model(), ids(300, 4)
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS)
    with caplog.at_level("WARNING", logger="docqa.engine.prefix_cache"):
        for q in (ids(10, 5), ids(12, 6)):
            logits, cached, _, _ = ask(model, cache, "doc-1", doc + q)
            assert rel_err(logits, dense_logits(model, doc + q)) < TOL
    assert cached == 2 * SEG  # the second question: the document's segments from memory
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cannot write" in warnings[0]


def _gpu_like_cache(tmp_path, settings):
    """A prefix cache over the CUDA decoder's state (CPU tensors: no kernel runs here), with its
    GPU behaviour: segments are views of a live state's rows until a background writer has
    written their files."""
    pytest.importorskip("triton", reason="the CUDA state's module needs triton")
    from docqa.engine.gpu.state import CudaKVState
    from docqa.engine.segment_files import SegmentReader

    return PrefixCache(lambda capacity: CudaKVState(CFG, settings, capacity, device="cpu"), "model-a", settings,
                       shape=(CFG.n_layers, CFG.n_kv_heads, CFG.head_dim), layout="rotated-true",
                       cache_dir=tmp_path / "kv", keep_live=True, reader=SegmentReader(torch.device("cpu")))


def _fill(state, a: int, b: int, seed: int) -> None:
    """Random K/V and descriptors at positions a..b-1, as a prefill would write them."""
    g = torch.Generator().manual_seed(seed)
    bs = state.settings.block_size
    for t, lo, hi in ((state.k, a, b), (state.v, a, b), (state.kmin, a // bs, -(-b // bs)),
                      (state.kmax, a // bs, -(-b // bs)), (state.kmean, a // bs, -(-b // bs))):
        t[:, lo:hi] = torch.randn(t[:, lo:hi].shape, generator=g)
    state.num_tokens = b


def test_a_live_state_reused_while_its_files_are_written(tmp_path, monkeypatch, caplog):
    """A GPU state saved, then continued at once by a prompt that shares only part of it (serve
    under load): the files of the segments it is about to overwrite are written first, with the
    rows as they were — never with the new prompt's rows under the old checksum, which another
    process then took for a damaged file."""
    import threading

    import docqa.engine.prefix_cache as pc

    s = EngineSettings(positions="true", **SMALL)
    seg = s.segment_size
    cache = _gpu_like_cache(tmp_path, s)
    gate = threading.Event()  # the writer is behind: it starts a second after the save
    real = pc.write_segment_file
    monkeypatch.setattr(pc, "write_segment_file", lambda *a, **k: (gate.wait(10), real(*a, **k)))
    doc = ids(3 * seg + 10, 1)
    state = cache.new_state(4 * seg)
    _fill(state, 0, len(doc), seed=1)
    want = state.k[:, :3 * seg].clone()
    threading.Timer(1.0, gate.set).start()
    assert cache.save("doc", doc, state) == 3
    other = doc[:seg + 5] + ids(2 * seg, 2)  # shares one segment and five tokens
    reused, n = cache.get_state("doc", other)
    assert reused is state and n == seg + 5
    _fill(reused, n, len(other), seed=2)  # the new prompt's prefill overwrites the rows after n
    cache.flush()
    with caplog.at_level("WARNING", logger="docqa.engine.prefix_cache"):
        for c in (cache, _gpu_like_cache(tmp_path, s)):  # this process, and another one over the files
            got, cached = c.get_state("doc", doc)
            assert cached == 3 * seg and torch.equal(got.k[:, :3 * seg], want)
    assert not caplog.records


def test_concurrent_writers_and_readers_of_one_segment_never_see_a_partial_file(tmp_path):
    """Two writers put different copies of one segment at one path (two processes that read the
    same document), while two readers read it the way the CPU and the GPU states do: a reader
    finds no file, or a whole one whose bytes match its header's checksum."""
    import threading

    pytest.importorskip("triton", reason="the CUDA state's module needs triton")
    from docqa.engine.gpu.state import _open_segment_file
    from docqa.engine.segment_files import (SegmentReader, read_segment_file, tensor_checksum,
                                            write_segment_file)

    path = tmp_path / "ab" / "seg.safetensors"
    shapes = {"k": (2, 512, 2, 64), "v": (2, 512, 2, 64), "kmin": (2, 8, 2, 64)}
    stop, bad, seen = threading.Event(), [], []

    def writer(seed):
        g = torch.Generator().manual_seed(seed)
        while not stop.is_set():
            write_segment_file(path, {n: torch.randn(sh, generator=g) for n, sh in shapes.items()})

    def cpu_reader():
        while not stop.is_set():
            in_place = path.exists()  # asked before the read: a file placed after it is no fault
            t = read_segment_file(path)
            if t is None and in_place:
                bad.append("a file in place read as damaged")
            seen.append(t is not None)

    def gpu_reader():
        reader = SegmentReader(torch.device("cpu"), threads=2)
        views = {n: torch.empty(sh) for n, sh in shapes.items()}
        while not stop.is_set():
            opened = _open_segment_file(path, views)
            if opened is None:
                continue
            fd, jobs, checksum = opened
            try:
                reader.read(jobs)
            finally:
                os.close(fd)
            if tensor_checksum(views) != checksum:
                bad.append("header and bytes of different files")
            seen.append(True)

    threads = [threading.Thread(target=f, args=a) for f, a in
               ((writer, (1,)), (writer, (2,)), (cpu_reader, ()), (gpu_reader, ()))]
    for t in threads:
        t.start()
    import time

    time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    assert not bad and sum(seen) > 5
    assert not list(path.parent.glob("*.tmp"))  # every writer cleaned up after itself
