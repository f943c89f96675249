"""cure: CURE (local uncertainty repair) for block-parallel speculative decoding. Engine only: no UI."""
__version__ = "0.1.0"
