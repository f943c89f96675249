"""cure: CURE (local uncertainty repair) for block-parallel speculative decoding. Engine only: no UI.

    from cure_core import load
    model = load()                                   # the embedded default pair, the CLI's defaults
    print(model.generate("Write a Python function is_prime(n).", max_new_tokens=64).text)

Names load lazily (PEP 562): `import cure_core.config` must not pull in torch and transformers, so
`cure --help` stays fast.
"""
from importlib import import_module

from .version import __version__

_EXPORTS = {"load": "api", "open_pair": "api", "Block": "block", "ConfigError": "config",
            "DecodeConfig": "config", "Engine": "engine", "ModelPair": "engine", "EngineArgs": "options",
            "Generation": "models", "LoadedPair": "models", "build_pair": "models", "load_pair": "models"}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'cure_core' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
