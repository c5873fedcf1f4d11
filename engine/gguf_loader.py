"""A small GGUF reader: metadata and tensors, memory-mapped.

`gguf.GGUFReader` builds a Python object per array element, which takes ~8 s on a 49K-token
vocabulary; this reader parses the header with plain struct/numpy reads (~0.1 s) and leaves
dequantisation to `gguf.quants.dequantize`. tests/test_engine_checkpoint.py checks it against
GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from .config import CheckpointError

_GGUF_MAGIC = b"GGUF"
_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # PyTorch order (outermost first), i.e. GGUF dims reversed
    qtype: GGMLQuantizationType
    raw: np.ndarray  # uint8 view into the memory map

    def to_numpy(self) -> np.ndarray:
        """Dequantised float32 (or the file's F32/F16/BF16 values as float32)."""
        if self.qtype == GGMLQuantizationType.F32:
            return self.raw.view(np.float32).reshape(self.shape)
        if self.qtype == GGMLQuantizationType.F16:
            return self.raw.view(np.float16).reshape(self.shape).astype(np.float32)
        block, size = GGML_QUANT_SIZES[self.qtype]
        if self.qtype in _FAST:
            blocks = torch.from_numpy(self.raw).view(-1, size)
            return _FAST[self.qtype](blocks).reshape(self.shape).numpy()
        rows = self.raw.reshape(-1, self.shape[-1] // block * size)
        return dequantize(rows, self.qtype).reshape(self.shape)


# gguf.quants.dequantize works in row groups through numpy (~2 s for a 135M Q4_1 model); these
# one-pass torch versions of the commonest simple types are ~10x faster and are checked against it.
def _scale(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # ggml packs element j in the low nibble of byte j and element j+16 in its high nibble.
    return torch.cat((qs & 0x0F, qs >> 4), dim=1).float()


def _q8_0(blocks):
    return _scale(blocks, 0) * blocks[:, 2:].view(torch.int8).float()


def _q4_0(blocks):
    return _scale(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8.0)


def _q4_1(blocks):
    return _scale(blocks, 0) * _nibbles(blocks[:, 4:]) + _scale(blocks, 2)


_FAST = {GGMLQuantizationType.Q8_0: _q8_0, GGMLQuantizationType.Q4_0: _q4_0,
         GGMLQuantizationType.Q4_1: _q4_1}


class GGUFFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                # Copy-on-write keeps the file untouched while giving torch a writable buffer.
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            self._map = np.frombuffer(self._mmap, dtype=np.uint8)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read GGUF file {self.path}: {e}") from None
        self._pos = 0
        try:
            self._parse()
        except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{self.path} is not a valid GGUF file ({e})") from None

    # -- header parsing ------------------------------------------------------------------
    def _read(self, n: int) -> bytes:
        b = self._mmap[self._pos:self._pos + n]
        if len(b) != n:
            raise ValueError("truncated header")
        self._pos += n
        return b

    def _unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self._mmap, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        return self._read(self._unpack("<Q")).decode("utf-8")

    def _strings(self, count: int) -> list[str]:
        # A tokenizer's vocabulary and merges are 100K+ strings each: one tight loop, without
        # the per-element type dispatch of _value.
        mm, pos, out = self._mmap, self._pos, []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            (n,) = length(mm, pos)
            out.append(mm[pos + 8:pos + 8 + n].decode("utf-8"))
            pos += 8 + n
        if pos > len(mm):
            raise ValueError("truncated header")
        self._pos = pos
        return out

    def _value(self, vtype: int) -> Any:
        vtype = GGUFValueType(vtype)
        if vtype == GGUFValueType.STRING:
            return self._string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = GGUFValueType(self._unpack("<I")), self._unpack("<Q")
            if etype in _SCALAR and etype != GGUFValueType.BOOL:
                dt = np.dtype(_SCALAR[etype])
                arr = np.frombuffer(self._read(count * dt.itemsize), dtype=dt)
                return arr.tolist()
            if etype == GGUFValueType.STRING:
                return self._strings(count)
            return [self._value(etype) for _ in range(count)]
        return self._unpack(_SCALAR[vtype])

    def _parse(self) -> None:
        if self._read(4) != _GGUF_MAGIC:
            raise ValueError("bad magic")
        version = self._unpack("<I")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._unpack("<Q") for _ in range(self._unpack("<I"))]
            qtype = GGMLQuantizationType(self._unpack("<I"))
            infos.append((name, tuple(reversed(dims)), qtype, self._unpack("<Q")))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = -(-self._pos // align) * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, shape, qtype, offset in infos:
            block, size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(shape)) if shape else 1
            nbytes = n // block * size
            start = data_start + offset
            raw = self._map[start:start + nbytes]
            if raw.shape[0] != nbytes:
                raise ValueError(f"tensor {name} runs past the end of the file")
            self.tensors[name] = GGUFTensor(name, shape, qtype, raw)
