"""Matrix products on GGUF quantised blocks as stored, on the CPU (gguf_cpu.cpp).

The C++ source is compiled on first use with the machine's C++ compiler (`$CXX`, else `c++`) for
this CPU (`-march=native`) and cached under the docqa cache folder, keyed by the source, the
flags and the CPU's feature list; a second process loads the cached library in milliseconds.
It is called through ctypes (a plain C ABI, so no torch headers and no ABI coupling) and runs
its OpenMP threads in the libgomp that torch has already loaded (same soname), so it shares
torch's thread count and pool. Where there is no compiler or the CPU lacks AVX-512 VNNI,
`library()` is None and the caller keeps dequantised weights (engine/gguf_weights.py).

naive_gguf.py is the reference: the same products on weights dequantised by the `gguf` package.
The library also holds a decode step's attention over an fp16 KV cache (`attend_f16`) and a whole
decode step through a Llama model's blocks (`gguf_decode`, engine/gguf_weights.DecodeStep).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).with_name("gguf_cpu.cpp")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
CPU_FEATURES = ("avx512f", "avx512bw", "avx512dq", "avx512_vnni")
# GGML type ids (gguf.GGMLQuantizationType) the kernel reads, and their (weights, bytes) per block.
BLOCKS = {2: (32, 18), 3: (32, 20), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
# At most this many activation rows go through the quantised dot products (each row costs a
# pass of int8 products over the weights); more rows dequantise each matrix to bf16 in slices
# and multiply with PyTorch's GEMM, whose cost per row is lower.
DOT_MAX_ROWS = 32
_SLICE_BYTES = 8 << 20  # bf16 weights dequantised at a time by the GEMM path
# A build takes seconds; one that runs for minutes is stuck (a compiler waiting on something).
BUILD_TIMEOUT_S = 300

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFMatrix:
    """A weight matrix [rows, cols] as GGUF blocks: `blocks` is uint8 [rows, bytes per row]
    (usually a view of the memory-mapped file), `qtype` its GGML type id."""

    blocks: torch.Tensor
    qtype: int
    cols: int

    def __post_init__(self):
        if self.qtype not in BLOCKS:
            raise ValueError(f"GGML type {self.qtype} is not one the CPU kernel reads")
        per, nbytes = BLOCKS[self.qtype]
        if self.cols % per or self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2 \
                or self.blocks.shape[1] != self.cols // per * nbytes or not self.blocks.is_contiguous():
            raise ValueError(f"blocks {tuple(self.blocks.shape)} {self.blocks.dtype} do not hold "
                             f"{self.cols} columns of GGML type {self.qtype}")

    @property
    def rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()


class UnavailableError(RuntimeError):
    """The kernel cannot be built or loaded here (the message says why)."""


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be (see `unavailable`)."""
    return _outcome()[0]


def unavailable() -> str | None:
    """Why `library()` is None, or None when it is available."""
    return _outcome()[1]


@functools.cache
def _outcome() -> tuple[ctypes.CDLL | None, str | None]:
    # Cached either way: a failed build is tried once per process, and said once, as a warning
    # (the engine then runs on dequantised fp32 weights).
    try:
        return _load(), None
    except UnavailableError as e:
        log.warning("gguf_cpu: no CPU kernel (%s); GGUF weights are dequantised to fp32 "
                    "(slower, about 4-8x the memory)", e)
        return None, str(e)


def _load() -> ctypes.CDLL:
    flags = _cpu_flags()
    missing = [f for f in CPU_FEATURES if f not in flags]
    if missing:
        raise UnavailableError(f"the CPU lacks {', '.join(missing)}")
    try:
        source = SOURCE.read_bytes()
    except OSError as e:
        raise UnavailableError(f"no kernel source: {e}") from None
    key = hashlib.sha256(source + " ".join(CFLAGS).encode() + " ".join(sorted(flags)).encode()).hexdigest()[:16]
    lib = _cache_dir() / f"gguf_cpu-{key}.so"
    if not lib.exists():
        _build(lib)
    try:
        dll = ctypes.CDLL(str(lib))
    except OSError as e:
        raise UnavailableError(f"cannot load {lib}: {e}") from None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    dll.gguf_mm.argtypes = [ptr, i64, i64, ctypes.c_int, ptr, ptr, ptr, ptr, ptr, i64, ctypes.c_int,
                            ptr, ctypes.c_float, ptr, ctypes.c_int]
    dll.gguf_dequant.argtypes = [ptr, i64, ctypes.c_int, i64, i64, i64, ptr, ctypes.c_int, ctypes.c_int]
    dll.gguf_decode.argtypes = [ptr, ctypes.c_int, ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, i64, ptr, ptr,
                                ctypes.c_int]
    dll.attend_f16.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ptr,
                               ctypes.c_int]
    return dll


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cache_dir() -> Path:
    """Where built libraries live: the docqa cache folder (`$XDG_CACHE_HOME`, else ~/.cache), never
    the source tree or site-packages (often read-only); where that cannot be written (a read-only
    home in CI or a container), a folder of this user's own under the temporary directory."""
    from docqa.engine.settings import cache_home

    home = cache_home() / "docqa" / "kernels"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK | os.X_OK):
            return home
    except OSError:
        pass
    tmp = Path(tempfile.gettempdir()) / f"docqa-kernels-{os.getuid()}"
    try:
        tmp.mkdir(mode=0o700, exist_ok=True)
        st = tmp.stat()
        # A shared temporary directory: load only from a folder no other user can write to.
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise UnavailableError(f"{tmp} is not this user's own folder")
    except OSError as e:
        raise UnavailableError(f"no writable cache folder ({home}: {e})") from None
    return tmp


def _build(lib: Path) -> None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise UnavailableError("no C++ compiler (set CXX or install g++)")
    # Built under a temporary name and renamed: processes starting together never load half a file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cxx, *CFLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["?"])[-1]
            raise UnavailableError(f"compiling {SOURCE.name} with {cxx} failed: {last}")
        os.replace(tmp, lib)
    except (OSError, subprocess.SubprocessError) as e:  # a CXX that does not run, a build that hangs
        raise UnavailableError(f"compiling {SOURCE.name} with {cxx} failed: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class GGUFProduct:
    """x [M, K] (fp32) @ [W_0; W_1; ...]^T -> fp32 [M, sum of rows] for GGUFMatrix W_i of K
    columns (q/k/v or gate/up as one call), with the kernel's arguments prepared once: a decode
    step makes about 4 calls a layer. Up to DOT_MAX_ROWS rows: int8 activations against the
    blocks, fp32 accumulation. More rows: each W_i dequantised to bf16 a slice at a time, times
    bf16 x (PyTorch's GEMM, fp32 accumulation, bf16 output).

    norm: an RMSNorm weight [K] (with eps) applied to x first; bias [sum of rows] added;
    swiglu: the matrices are [gate; up] and the result is silu(gate) * up, [M, sum of rows / 2]
    — the ops around a product that would otherwise cost a dispatch each per layer."""

    def __init__(self, mats: list[GGUFMatrix] | tuple[GGUFMatrix, ...], *, norm: torch.Tensor | None = None,
                 eps: float = 1e-6, bias: torch.Tensor | None = None, swiglu: bool = False):
        if not mats or any(w.cols != mats[0].cols for w in mats):
            raise ValueError(f"matrices of {[w.shape for w in mats]} do not share their columns")
        self.mats, self.cols = tuple(mats), mats[0].cols
        self.rows = sum(w.rows for w in mats)
        if swiglu and self.rows % 2:
            raise ValueError(f"swiglu needs [gate; up] halves, not {self.rows} rows")
        for name, t, size in (("norm weight", norm, self.cols), ("bias", bias, self.rows)):
            if t is not None and (t.shape != (size,) or t.dtype != torch.float32 or not t.is_contiguous()):
                raise ValueError(f"{name} {tuple(t.shape)} {t.dtype} does not fit {size} (fp32, contiguous)")
        self.norm, self.eps, self.bias, self.swiglu = norm, eps, bias, swiglu
        n = len(mats)
        self._args = (n, (ctypes.c_void_p * n)(*(w.blocks.data_ptr() for w in mats)),
                      (ctypes.c_int64 * n)(*(w.rows for w in mats)),
                      (ctypes.c_int64 * n)(*(w.blocks.shape[1] for w in mats)),
                      (ctypes.c_int * n)(*(w.qtype for w in mats)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lib = library()
        if lib is None:
            raise UnavailableError(unavailable())
        if x.dim() != 2 or x.shape[1] != self.cols:
            raise ValueError(f"x {tuple(x.shape)} does not fit matrices of {[w.shape for w in self.mats]}")
        m = x.shape[0]
        out = torch.empty(m, self.rows, dtype=torch.float32)
        if m > DOT_MAX_ROWS:
            if self.norm is not None:
                x = F.rms_norm(x.float(), (self.cols,), self.norm, self.eps)
            xb, at = x.to(torch.bfloat16), 0
            for w in self.mats:
                step = max(1, _SLICE_BYTES // (2 * w.cols))
                for n0 in range(0, w.rows, step):
                    n1 = min(w.rows, n0 + step)
                    out[:, at + n0:at + n1] = xb @ dequantize(w, n0, n1, torch.bfloat16).t()
                at += w.rows
            if self.bias is not None:
                out += self.bias
            if self.swiglu:
                gate, up = out.chunk(2, dim=1)
                return F.silu(gate) * up
            return out
        x = x.contiguous().float()
        norm = None if self.norm is None else self.norm.data_ptr()
        bias = None if self.bias is None else self.bias.data_ptr()
        rc = lib.gguf_mm(x.data_ptr(), m, self.cols, *self._args, out.data_ptr(), self.rows, torch.get_num_threads(),
                         norm, self.eps, bias, int(self.swiglu))
        if rc != 0:
            raise ValueError(f"gguf_mm failed ({rc})")
        return out[:, :self.rows // 2] if self.swiglu else out


def gguf_mm(x: torch.Tensor, mats: list[GGUFMatrix] | tuple[GGUFMatrix, ...]) -> torch.Tensor:
    """`GGUFProduct(mats)(x)` for a one-off product."""
    return GGUFProduct(mats)(x)


def dequantize(w: GGUFMatrix, n0: int = 0, n1: int | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows [n0, n1) of w as `dtype` (float32 or bfloat16) [n1 - n0, cols]."""
    lib = library()
    if lib is None:
        raise UnavailableError(unavailable())
    n1 = w.rows if n1 is None else n1
    if dtype not in (torch.float32, torch.bfloat16) or not 0 <= n0 <= n1 <= w.rows:
        raise ValueError(f"cannot dequantise rows {n0}:{n1} of {w.shape} to {dtype}")
    out = torch.empty(n1 - n0, w.cols, dtype=dtype)
    rc = lib.gguf_dequant(w.blocks.data_ptr(), w.blocks.shape[1], w.qtype, w.cols, n0, n1, out.data_ptr(),
                          int(dtype == torch.bfloat16), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"cannot dequantise GGML type {w.qtype} with {w.cols} columns")
    return out



def attend_f16(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: int,
               cos: torch.Tensor | None = None, sin: torch.Tensor | None = None) -> torch.Tensor:
    """A decode step's attention over an fp16 KV cache: q [Hq, D], the new k and v [Hkv, D] (fp32,
    before RoPE) turned by cos/sin [D] (HF's rotate-half layout; none when cos is None), k and v
    stored as fp16 at row `pos` of kc/vc [Hkv, capacity, D], then softmax(q k^T / sqrt(D)) v over
    rows 0..pos -> [Hq, D] fp32. Query head h reads KV head h // (Hq / Hkv)."""
    lib = library()
    if lib is None:
        raise UnavailableError(unavailable())
    hq, d = q.shape
    hkv, cap, _ = kc.shape
    if kc.dtype != torch.float16 or vc.shape != kc.shape or vc.dtype != torch.float16 or kc.shape[2] != d \
            or not (kc.is_contiguous() and vc.is_contiguous()) or k.shape != (hkv, d) or v.shape != (hkv, d):
        raise ValueError(f"cache {tuple(kc.shape)} {kc.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         f"do not fit q {tuple(q.shape)}")
    q, k, v = (t.contiguous().float() for t in (q, k, v))
    if cos is not None:
        cos, sin = cos.reshape(d).contiguous().float(), sin.reshape(d).contiguous().float()
    out = torch.empty(hq, d, dtype=torch.float32)
    rc = lib.attend_f16(q.data_ptr(), hq, hkv, d, k.data_ptr(), v.data_ptr(),
                        None if cos is None else cos.data_ptr(), None if sin is None else sin.data_ptr(),
                        kc.data_ptr(), vc.data_ptr(), cap, pos, d ** -0.5, out.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"attend_f16 cannot take q {tuple(q.shape)} at {pos} of a {tuple(kc.shape)} cache")
    return out
