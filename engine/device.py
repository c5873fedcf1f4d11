"""Which device the engine runs on: `--device` / `DOCQA_DEVICE`, else CUDA when present."""

from __future__ import annotations

import torch

from ..errors import DocqaError
from .settings import env_device


class DeviceError(DocqaError):
    """A device asked for that this machine or torch build does not have."""


def resolve_device(choice: str | torch.device | None = None) -> torch.device:
    """"auto" (the default) picks the first CUDA device when torch sees one, else the CPU.
    An explicit "cuda" on a machine without one is an error, not a silent fall-back: a user
    who asked for the GPU should learn that it is not there."""
    if isinstance(choice, torch.device):
        return choice
    choice = (choice or env_device() or "auto").strip().lower()
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(choice)
    except RuntimeError as e:
        raise DeviceError(f"unknown device {choice!r} (cpu, cuda, cuda:N or auto)") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {choice!r} asked for, but this torch build sees no CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"device {choice!r} asked for, but only {torch.cuda.device_count()} CUDA devices exist")
    elif device.type != "cpu":
        raise DeviceError(f"unsupported device {choice!r} (cpu, cuda, cuda:N or auto)")
    return device
