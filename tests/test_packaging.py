"""The wheel must carry every subpackage (an editable install would hide a missing one)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {"docqa"} | {
        "docqa." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("app", "engine", "kernels", "pipelines", "fixtures")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed


def test_no_generic_top_level_names():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "docqa" or p.startswith("docqa.") for p in cfg["packages"])
    assert cfg["package-dir"] == {"docqa": "."}
