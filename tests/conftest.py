"""Shared fixtures: tiny random models built in-process (no downloads)."""
import contextlib
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

from cure_core.drafters.causal import ArDrafter, PardDrafter
from cure_core.engine import ModelPair
from cure_core.options import EngineArgs
from cure_core.tiny import BYTE_VOCAB, MASK_ID, perturbed_copy, tiny_target

torch.set_num_threads(1)

# what `dtype` auto loads a CPU target in here: int8 where fbgemm has AVX512-VNNI, else bfloat16 where oneDNN runs it
# natively, else float32
AUTO_DTYPE = EngineArgs().target_dtype()


@pytest.fixture(autouse=True)
def one_thread():
    """Each test ends with one torch thread again: a script a test runs may set --threads, and a count left
    above the free cores makes every later parallel op wait on descheduled threads (seen: a 30 s test took 15
    minutes beside another job)."""
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def private_cost_curves(tmp_path_factory):
    """Cost curves measured by tests go to a temporary file, not the user's cache (~/.cache/cure):
    they are keyed by tiny models' tmp paths and would pile up there run after run."""
    from cure_core import budget
    path = tmp_path_factory.mktemp("cost_curves") / "cost_curves.json"
    saved = budget._cache_file
    budget._cache_file = lambda: path
    yield path
    budget._cache_file = saved


@pytest.fixture(scope="session")
def target():
    return tiny_target(seed=0)


@pytest.fixture(scope="session")
def drafts(target):
    """Perturbed copies of the target: mild and strong noise."""
    return {"mild": perturbed_copy(target, noise=0.2, seed=1), "strong": perturbed_copy(target, noise=0.6, seed=2)}


def make_pair(target, draft_model, eos_ids=(), max_context=None):
    return ModelPair(target=target,
                     drafter=PardDrafter(draft_model, MASK_ID, vocab_size=BYTE_VOCAB),
                     ar_drafter=ArDrafter(draft_model, vocab_size=BYTE_VOCAB),
                     eos_ids=tuple(eos_ids), max_context=max_context)


@pytest.fixture(scope="session")
def pair(target, drafts):
    return make_pair(target, drafts["mild"])


@contextlib.contextmanager
def benchmark_script(name: str):
    """benchmarks/<name>.py imported as a module for the duration (registered in sys.modules, where
    dataclasses look their module up), then forgotten."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"cure_bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)

