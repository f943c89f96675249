"""Where an int8 target's forward (`--dtype int8`, Int8Decoder) spends its time on this CPU (session 43).

    python benchmarks/results/int8_forward_s43_cpu/int8_forward.py --ctx 400 --rows 1,16 --reps 12

One forward of N rows after a --ctx context, through CachedLM as the engine runs it, timed as it is and with
parts replaced by stand-ins (not the real numbers: only their time is of interest):
  no_attn   exact_attention replaced by zeros            -> the attention's share
  raw_lin   row_int8_matmul's per-row quantization left out (the fbgemm matmul alone, one fixed scale)
  both      both of the above                            -> what is left: norms, rotary, cache, head, Python
and the matmuls alone (every layer's four fused int8 weights and the head, on random rows). Variants run in
alternation; the median of --reps is reported, after 2 dropped."""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from cure_core import load  # noqa: E402
from cure_core.cpu_kernels import row_int8_matmul  # noqa: E402
from cure_core.lm import CachedLM  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctx", type=int, default=400)
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load(strategy="ar", dtype="int8").pair.target
    lm = CachedLM(model, kv="static", capacity=a.ctx + 128)
    lm.prefill(list(range(100, 100 + a.ctx)))
    dec, head = lm.int8_decoder(), model.get_output_embeddings()
    hidden, inter = int(model.config.hidden_size), int(model.config.intermediate_size)
    raw = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32
    attend, lin = dec._attend, dec._lin
    no_attn = lambda q, k, v, mask, s: torch.zeros(q.shape[2], q.shape[1] * q.shape[3])  # noqa: E731
    raw_lin = lambda x, w: raw(x, 0.01, 64, w[0])                                         # noqa: E731
    variants = {"forward": (attend, lin), "no_attn": (no_attn, lin), "raw_lin": (attend, raw_lin),
                "both": (no_attn, raw_lin)}

    def forward_ms(n: int) -> float:
        t = time.perf_counter()
        f = lm.forward([5] * n, [-1] + list(range(n - 1)))
        f.logits.argmax(-1).tolist()
        ms = (time.perf_counter() - t) * 1e3
        lm.rollback()
        return ms

    def matmuls_ms(n: int) -> float:
        x, xi = torch.randn(n, hidden), torch.randn(n, inter)
        t = time.perf_counter()
        for layer in dec.layers:
            row_int8_matmul(x, *layer.qkv), row_int8_matmul(x, *layer.o)
            row_int8_matmul(x, *layer.gate_up), row_int8_matmul(xi, *layer.down)
        row_int8_matmul(x, head.int8, None)
        return (time.perf_counter() - t) * 1e3

    for n in (int(r) for r in a.rows.split(",")):
        times = {k: [] for k in [*variants, "matmuls"]}
        for _ in range(a.reps + 2):
            for k, (att, ln) in variants.items():
                dec._attend, dec._lin = att, ln
                times[k].append(forward_ms(n))
            times["matmuls"].append(matmuls_ms(n))
        dec._attend, dec._lin = attend, lin
        med = {k: statistics.median(v[2:]) for k, v in times.items()}
        print(f"rows {n:2d} ctx {a.ctx}: " + "  ".join(f"{k} {v:.1f} ms" for k, v in med.items())
              + f"  (threads {a.threads}, load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
