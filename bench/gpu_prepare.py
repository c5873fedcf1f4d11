"""Everything the GPU machine needs that it cannot fetch, made here (it has no package index):
the wheels of docqa's dependencies its image lacks (scripts/gpu_wheels.sh -> .whl/) and the
tokenizer of the default model as tokenizer.json + tokenizer_config.json (-> .gpu/tokenizer/),
which bench/gpu.py puts beside the random-weight checkpoints it writes. Both folders are
git-ignored and travel with the device tool's `carry`. The default model's GGUF (94 MiB) is
over one carry's 64 MiB: it is cut into .gpu-part1/ and .gpu-part2/, carried by two calls
in a row (a warm machine keeps the first's), and bench/gpu_run.sh joins them for the test
that compares its greedy text on the GPU with the CPU's.

    python3 bench/gpu_prepare.py   (then run bench/gpu_run.sh on the GPU machine)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_wheels.sh")], check=True)
    from docqa.engine import Engine

    tok = Engine.load_tokenizer(None)
    out = ROOT / ".gpu" / "tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    tok.tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": tok.token_text(tok.bos_id), "eos_token": tok.token_text(tok.eos_id),
        "add_bos_token": tok.add_bos, "chat_template": tok.chat_template}))
    print(f"wrote {out} ({sum(f.stat().st_size for f in out.iterdir()) / 2**20:.1f} MiB)", file=sys.stderr)
    from docqa.engine.default_model import default_model_path

    data = default_model_path().read_bytes()
    half = len(data) // 2
    for name, part in ((".gpu-part1", data[:half]), (".gpu-part2", data[half:])):
        (ROOT / name).mkdir(exist_ok=True)
        (ROOT / name / "default.gguf.part").write_bytes(part)
    print(f"wrote .gpu-part1/ and .gpu-part2/ ({len(data) / 2**20:.1f} MiB of GGUF)", file=sys.stderr)


if __name__ == "__main__":
    main()
