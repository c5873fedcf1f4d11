"""Make a checkout importable as `docqa` for the GPU bench scripts run from it as scripts.

The GPU machines run a snapshot of the working tree with no install. The scripts need only
engine/gpu and kernels/, so engine/__init__ (checkpoint loaders, tokenizer: extras a bare GPU
image may lack) is skipped by registering `docqa.engine` as a bare namespace.
"""

from __future__ import annotations

import os
import sys
import tempfile
import types


def import_checkout() -> None:
    if "docqa" in sys.modules:
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shim = tempfile.mkdtemp(prefix="docqa-path-")
    os.symlink(root, os.path.join(shim, "docqa"))
    sys.path.insert(0, shim)
    import docqa  # noqa: F401

    engine = types.ModuleType("docqa.engine")
    engine.__path__ = [os.path.join(root, "engine")]
    sys.modules["docqa.engine"] = engine
