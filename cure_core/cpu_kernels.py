"""Prepacked float32 (and bfloat16) matmuls for CPU inference (speed only, never the output's meaning).

Why: on a CPU, torch's default float32 `linear` (MKL sgemm) takes a matrix-vector path for one
input row but re-packs the whole weight matrix on every call with two or more rows. A verify
forward over root + 1 node then costs about 2x a one-token step, so no tree can pay (measured
on the 2-core box, Qwen2.5-Coder-0.5B: 174 ms for 1 token, 357 ms for 2, 461 ms for 16).
oneDNN can pack each weight once, at load time (the layout inductor's freezing pass uses); a
forward then streams every weight once whatever the node count: 133 ms for 1 token, 161 ms for 2,
225 ms for 16 at 2 threads. The one-token step itself gets faster too.

Rule: packing changes rounding, not semantics (|error| ~1e-6 relative). Losslessness is about
the strategies against `ar` on the same model, and every strategy runs the same packed layers.

`pack_linears` swaps every nn.Linear of a float32 or bfloat16 CPU model for a PackedLinear in place. The
output head keeps its `weight` Parameter (it is usually tied to the embedding, and drafters read
it); other layers drop theirs, so memory stays about the same.

`pack_linears(model, int8=True)` (a drafter under `--draft-dtype int8`) makes every layer but the head an
Int8Linear: the packed weight for long passes plus an int8 copy for short ones. Why: a drafter's chain
step is one row, where a matmul only streams its weight, and int8 weights are half of bfloat16's bytes
(Qwen2.5-0.5B's 168 layers, 2 threads: 20 ms a one-row pass against 40 ms packed bfloat16; at 64 rows
int8 is the slower one, 75 against 54 ms).
"""
from __future__ import annotations

import functools
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

KERNELS = ("auto", "packed", "eager")     # auto = packed where it applies (CPU, float32 or bfloat16, oneDNN present)
MIN_ROWS = 4                              # packed matmuls run at least this many rows (see PackedLinear)
INT8_MAX_ROWS = 16                        # Int8Linear's int8 matmul runs passes of up to this many rows


def unavailable_reason(model: nn.Module) -> str | None:
    """Why `model` cannot be packed, or None when it can."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return "this torch build has no oneDNN (mkldnn) linear"
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return "the model has no linear layers"
    for m in linears:
        w = m.weight
        if w.device.type != "cpu":
            return f"the model is on {w.device.type}, not the CPU"
        # Rule: bfloat16 packs only where oneDNN has bfloat16 kernels (AVX512-BF16, AMX); elsewhere it would
        # emulate them. A bfloat16 drafter then reads half the bytes of a float32 one per pass.
        if w.dtype == torch.bfloat16 and not bf16_kernels():
            return "this CPU has no oneDNN bfloat16 kernels"
        if w.dtype not in (torch.float32, torch.bfloat16):
            return f"the model is {str(w.dtype).removeprefix('torch.')}, not float32 or bfloat16"
    return None


@functools.lru_cache(maxsize=None)
def bf16_kernels() -> bool:
    """Whether oneDNN runs bfloat16 matmuls natively on this CPU. Rule: torch's check, and on x86 the CPU's
    AVX512-BF16 or AMX too. torch's check alone also passes on AVX512 without them, where oneDNN emulates
    bfloat16: there a packed bfloat16 0.5B took 197 ms a one-row step against float32's 126 (session 46, a
    Xeon without AVX512-BF16), so bfloat16 is nothing to pick there."""
    flags = _cpu_flags()
    x86 = "sse2" in flags
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and (not x86 or bool(flags & {"avx512_bf16", "amx_bf16"}))


def resolve_kernels(kernels: str, model: nn.Module) -> bool:
    """Whether to pack `model`: 'packed' insists (clear error when it cannot), 'auto' packs where it
    applies, 'eager' never packs."""
    if kernels not in KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNELS)}")
    if kernels == "eager":
        return False
    why = unavailable_reason(model)
    if kernels == "packed" and why:
        raise ValueError(f"`kernels` packed: {why}")
    return why is None


def int8_kernels() -> bool:
    """Whether this torch build has the int8 matmuls Int8Linear runs (fbgemm's dynamic linear, x86)."""
    engines = set(torch.backends.quantized.supported_engines)
    return bool(engines & {"fbgemm", "x86"}) and hasattr(torch.ops.quantized, "linear_dynamic")


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), ()))
    except OSError:
        return set()


# Rule: without AVX512-VNNI, fbgemm's int8 matmul multiplies u8 x s8 pairs into saturating int16 sums (AVX2's
# vpmaddubsw), so full 8-bit activations overflow on wide layers (a 30% error on a 64-wide layer); such CPUs
# quantize activations to 7 bits (`reduce_range`), as torch's own dynamic quantization does there. fbgemm picks
# its VNNI kernels on avx512_vnni alone (torch's is_cpu_support_vnni asks the same), so a CPU with only AVX-VNNI
# (client Intel cores) counts as without.
REDUCE_RANGE = "avx512_vnni" not in _cpu_flags()


def cpu_info() -> dict:
    """What a timing ran on, for result files: the CPU's model name (Linux /proc/cpuinfo; None elsewhere) and
    which of these kernels it runs (a CPU with AMX and one without differ in which drafter dtype pays)."""
    name = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    return {"cpu_model": name, "bf16_kernels": bf16_kernels(), "int8_kernels": int8_kernels()}


def is_packed(model: nn.Module) -> bool:
    """Whether pack_linears has run on `model` (any of its layers is a PackedLinear)."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def is_int8(model: nn.Module) -> bool:
    """Whether pack_linears(int8=True) has run on `model` (any of its layers is an Int8Linear)."""
    return any(isinstance(m, Int8Linear) for m in model.modules())


class PackedLinear(nn.Module):
    """y = x W^T + b with W packed once by oneDNN. Inference only; with autograd on, it falls back to
    F.linear on the kept weight (the output head) or refuses (every other layer dropped its W)."""

    def __init__(self, linear: nn.Linear, keep_weight: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w)     # opaque oneDNN layout, [out, in]
        self.weight_dtype = w.dtype
        self.bias = None if linear.bias is None else linear.bias       # stays a Parameter (state_dict names)
        self.weight = linear.weight if keep_weight else None
        self.max_rows = 0           # > 0: longer passes run in pieces of this many rows (row_invariant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or (self.weight is not None and self.weight.requires_grad)):
            if self.weight is None:
                raise RuntimeError("this layer was packed for inference (`kernels` packed); "
                                   "load the model with kernels='eager' to train through it")
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, self.in_features)                         # [M, in]
        step = self.max_rows
        if step and rows.shape[0] > step:
            y = torch.cat([self._pass(rows[i:i + step]) for i in range(0, rows.shape[0], step)])
        else:
            y = self._pass(rows)
        return y.view(*x.shape[:-1], self.out_features)

    def _pass(self, rows: torch.Tensor) -> torch.Tensor:
        """One oneDNN matmul: rows [M, in] -> [M, out]."""
        bias = None if self.bias is None else self.bias.detach()
        m = rows.shape[0]
        if 0 < m < MIN_ROWS:
            # Rule: fewer than MIN_ROWS rows are padded with zero rows. oneDNN's path for 1-2 rows is
            # slower than its 4-row one on the same packed weight (2-core EPYC, Qwen2.5-0.5B shapes:
            # MLP 0.92 ms at 1 row vs 0.80 at 4; head 28.2 vs 26.1); a one-token step of the 0.5B
            # got 8% faster (128 -> 117 ms, interleaved A/B). A row's result does not depend on the
            # rows that come with it (bitwise, 1..64 rows; tests/test_kernels.py).
            rows = torch.cat([rows, rows.new_zeros((MIN_ROWS - m, self.in_features))])
        y = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), self.packed, bias, "none", [], "")  # [M', out]
        return y[:m]

    def extra_repr(self) -> str:
        pieces = f", passes of <= {self.max_rows} rows" if self.max_rows else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed{pieces}")


PROBE_ROWS = 65         # row_invariant probes passes of MIN_ROWS .. this many rows (the largest tree + its root)


def _cancelling(rows: int, cols: int, sign: float, gen: torch.Generator) -> torch.Tensor:
    """[rows, cols] float32 [a, sign*a] halves (a: random signs, magnitudes over 2^-6..2^7): rows [u, u] times
    weights [v, -v] sum to exactly 0, and what a matmul returns is the rounding its order of summation left."""
    h, n = cols // 2, min(rows, 512)                  # 512 distinct rows, repeated (a head has 10^5)
    a = torch.exp2(torch.randint(-6, 7, (n, h), generator=gen).float()) * (1 + torch.rand(n, h, generator=gen))
    a = (a * (torch.randint(0, 2, (n, h), generator=gen).float() * 2 - 1)).repeat(-(-rows // n), 1)[:rows]
    out = torch.zeros(rows, cols)
    out[:, :h], out[:, h:2 * h] = a, sign * a
    return out


def invariant_rows(layer: PackedLinear, most: int = PROBE_ROWS) -> int:
    """The most rows R <= `most` such that every pass of 1..R rows gives each row the same bits, wherever it sits
    in the pass (fewer than MIN_ROWS rows are padded), for a layer of `layer`'s shape, dtype and bias.

    How: passes of n and n-1 rows are compared on their common rows, and the R-row pass with its rows reversed,
    on a probe layer whose every output is a sum that cancels exactly (`_cancelling`), so that any change of
    summation order shows in most outputs. Random inputs would hide it: in bfloat16 a different order changes
    the rounded output only where a sum falls near a rounding midpoint (about 1 output in 10^4, measured). 1: no
    pass but one row gives each row its bits (a row then runs alone)."""
    gen = torch.Generator().manual_seed(0)
    lin = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    with torch.no_grad():
        lin.weight.copy_(_cancelling(layer.out_features, layer.in_features, -1.0, gen))
        if lin.bias is not None:
            lin.bias.zero_()
    probe = type(layer)(lin.to(layer.weight_dtype), keep_weight=False)
    x = _cancelling(most, layer.in_features, 1.0, gen).to(layer.weight_dtype)        # [most, in]
    edge = most
    with torch.inference_mode():
        last = probe._pass(x[:1])
        for n in range(2, most + 1):
            y = probe._pass(x[:n])
            if not torch.equal(y[:n - 1], last):
                edge = n - 1
                break
            last = y
        if not torch.equal(probe._pass(x[:edge].flip(0)), last[:edge].flip(0)):
            return 1
    return edge


def row_invariant(model: nn.Module, most: int = PROBE_ROWS) -> int:
    """Make every PackedLinear of `model` run passes its rows do not depend on: each layer runs longer passes in
    pieces of its `invariant_rows` (probed once per shape). Returns the fewest rows any layer may take.

    Rule: a reduced-precision target's rows must not depend on the pass they come in, or a tree verify and a
    one-row `ar` step round a near tie differently (lossless decoding in bfloat16). oneDNN picks its bfloat16
    kernel by row count, and kernels sum in different orders: on an AMX Xeon, Qwen2.5's layers give one result
    for 1-32 rows and another from 33 on, while passes of one row count give every row the same bits wherever it
    sits and whatever comes beside it (tests/test_bf16_target.py). Which counts share a kernel is oneDNN's choice
    by CPU, dtype, shape and thread count, so it is probed, under the thread count the model loads with."""
    probed: dict[tuple, int] = {}
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for layer in layers:
        shape = (layer.in_features, layer.out_features, layer.bias is not None, layer.weight_dtype,
                 torch.get_num_threads())
        if shape not in probed:
            probed[shape] = invariant_rows(layer, most)
        layer.max_rows = probed[shape]
    return min(probed.values(), default=most)


def int8_rows(weight: torch.Tensor) -> torch.Tensor:
    """W [out, in] -> int8 with one scale per output row (its largest |w| -> 127): the weight of Int8Linear
    and RowInt8Linear."""
    w = weight.detach().float()                                          # [out, in]
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)                 # [out]
    with warnings.catch_warnings():   # torch marks quantized tensors deprecated; 2.13 (pinned) has them
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_channel(w, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0,
                                          torch.qint8)


class Int8Linear(PackedLinear):
    """A PackedLinear that runs passes of up to INT8_MAX_ROWS rows on an int8 copy of W (one scale per
    output row of W), with the inputs quantized to int8 on the fly (one scale per pass: fbgemm's dynamic
    linear) and the int32 sums scaled back to float. Longer passes (a prefill) run the packed weight.
    For drafters only: an int8 pass rounds more than a bfloat16 one (the 0.5B's greedy proposal agreed
    with the 1.5B target's at 81.1% of positions, bfloat16's at 81.6%), and a row's result depends on
    the rows in its pass (their largest input sets the scale), so only proposals change, never a
    verified token. Memory: the int8 copy adds half the packed bfloat16 weight's bytes."""

    def __init__(self, linear: nn.Linear, keep_weight: bool):
        super().__init__(linear, keep_weight)
        q = int8_rows(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.int8 = torch.ops.quantized.linear_prepack(q, bias)             # opaque fbgemm layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)                               # [M, in]
        if rows.shape[0] > INT8_MAX_ROWS or torch.is_grad_enabled():
            return super().forward(x)
        y = torch.ops.quantized.linear_dynamic(rows.float().contiguous(), self.int8, REDUCE_RANGE)   # [M, out] float32
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", int8 up to {INT8_MAX_ROWS} rows"


# RowInt8Linear's input grid: each row is divided by its own largest |x|, then quantized on one fixed grid
# (uint8 around a zero point; 7 bits where REDUCE_RANGE, so AVX2's pair sums cannot saturate).
ROW_QMAX = 127 if REDUCE_RANGE else 255
ROW_ZERO = (ROW_QMAX + 1) // 2                       # 64 or 128: -1.0 .. 1.0 maps to 1 .. ROW_QMAX
ROW_STEP = 1.0 / (ROW_QMAX // 2)                     # 1/63 or 1/127


def row_int8_matmul(rows: torch.Tensor, packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """rows [M, in] float32 @ an int8 weight prepacked without bias -> [M, out] float32 (+ bias): each row
    quantized on its own (RowInt8Linear's rule; int8_decoder.py runs fused weights through it too).

    Rule: a row goes in as two int8 rows of the same pass, its value on the grid and what the grid rounded
    off (scaled by 2 / ROW_STEP, so it spans the grid again), and their products are summed back: about 15
    bits of activation for the int8 weights, where one int8 row loses Qwen2.5's small channels beside its
    outliers. One pass streams the weight once and the rows stay independent. On the 0.5B
    (results/int8_activations_s46_cpu): hidden states 1-3% off float32's instead of 5%, greedy text equal to
    float32's on 6 of 18 held-out prompts instead of 1 (llama.cpp on the same GGUF: 8), for a one-row step
    11% dearer and a 16-row verify 31%."""
    m = rows.shape[0]
    scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)            # [M, 1]
    both = rows.new_empty((2 * m, rows.shape[1]))                            # [2M, in]
    hi, lo = both[:m], both[m:]
    torch.div(rows, scale, out=hi)                                           # [-1, 1]: the grid's range
    torch.mul(hi, 1.0 / ROW_STEP, out=lo)                                    # in grid steps
    lo.sub_(lo.round()).mul_(2.0)                                            # what the grid rounds off, x2
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(both, ROW_STEP, ROW_ZERO, packed)
    y = y[:m].add_(y[m:], alpha=ROW_STEP / 2).mul_(scale)                    # [M, out]
    return y if bias is None else y.add_(bias)


class RowInt8Linear(nn.Module):
    """y = x W^T + b with W in int8 (one scale per output row) and every input row quantized with its own
    scale: a target's `--dtype int8`. Each row is divided by its largest |x| and quantized on one fixed grid
    (ROW_STEP, ROW_ZERO) in two int8 levels (row_int8_matmul), fbgemm sums the int8 products exactly in
    int32, and the row's scale multiplies its output back. Nothing in a row's result depends on the other
    rows of its pass, so a tree verify of N rows gives each row what a one-row `ar` step gives it, bit for
    bit (tests/test_int8_target.py): the property lossless decoding in int8 rests on. fbgemm's dynamic
    linear (Int8Linear) shares one input scale over the pass, which is why drafters may use it and targets may not. Memory: a quarter of the
    float32 weight; the head keeps its float32 `weight` too (tied to the embedding, which reads it)."""

    def __init__(self, linear: nn.Linear, keep_weight: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q = int8_rows(linear.weight)
        self.int8 = torch.ops.quantized.linear_prepack(q, None)             # bias added after the row scale
        self.bias = None if linear.bias is None else linear.bias
        self.weight = linear.weight if keep_weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("int8 layers are for inference; load the model in float32 to train through it")
        bias = None if self.bias is None else self.bias.detach().float()
        y = row_int8_matmul(x.reshape(-1, self.in_features).float(), self.int8, bias)   # [M, out] float32
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, int8 rows"


def run_dtype(model: nn.Module) -> str:
    """The dtype a model's matmuls run in, by name: int8 for an int8 target, else its weights' dtype."""
    if any(isinstance(m, RowInt8Linear) for m in model.modules()):
        return "int8"
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def rows_exact(model: nn.Module) -> bool:
    """Whether a target's rows get the same bits whatever pass they come in, so that every strategy equals `ar`
    token for token: float32 (the lossless check), int8 (RowInt8Linear), or a reduced-precision target made
    row-invariant (row_invariant). A bfloat16 target on eager kernels or off the CPU is not."""
    return run_dtype(model) in ("float32", "int8") or any(
        isinstance(m, PackedLinear) and m.max_rows for m in model.modules())


def _swap_linears(model: nn.Module, make: Callable[[nn.Linear, bool], nn.Module]) -> int:
    """Replace every nn.Linear of `model` by make(linear, is_head), in place; returns how many."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, make(child, child is head))
                count += 1
    return count


def int8_target(model: nn.Module) -> int:
    """Swap every nn.Linear of `model` (the head too) for a RowInt8Linear, in place: a target under
    `--dtype int8`. Returns how many were swapped. The head keeps its weight (the embedding reads it)."""
    return _swap_linears(model, lambda lin, is_head: RowInt8Linear(lin, keep_weight=is_head))


def pack_linears(model: nn.Module, keep_weights: nn.Module | None = None, int8: bool = False) -> int:
    """Swap every nn.Linear in `model` for a PackedLinear, in place; returns how many were packed.
    The head, and every linear inside `keep_weights` (drafter training copies the target's last
    layer), keep their `weight`. `int8`: every layer but the head becomes an Int8Linear (a drafter's
    `--draft-dtype int8`; the head keeps the packed weight that drafters read rows of)."""
    kept = set(map(id, keep_weights.modules())) if keep_weights is not None else set()

    def make(lin: nn.Linear, is_head: bool) -> nn.Module:
        kind = Int8Linear if int8 and not is_head else PackedLinear
        return kind(lin, keep_weight=is_head or id(lin) in kept)
    return _swap_linears(model, make)
