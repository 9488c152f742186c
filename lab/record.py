"""What an offline experiment's JSON starts with: the command, when, and on what (lab/gil/cold_start.py and the
other probes of 2026-11-25)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hw, run from anywhere
from hw.interfaces.hogwild import machine  # noqa: E402


def write(path: Path, device: torch.device, **fields) -> None:
    """`fields` under the command line, the UTC time, torch, Python, the device and the machine, as JSON."""
    head = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "machine": machine()}
    path.write_text(json.dumps(head | fields, indent=1) + "\n")
