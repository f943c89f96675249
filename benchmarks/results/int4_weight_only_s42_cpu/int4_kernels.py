"""Weight-only int4 (aten._weight_int4pack_mm_for_cpu) against the int8 linears cure ships, per linear of the 0.5B's shapes."""
import json, sys, time, torch
from cure_core.cpu_kernels import RowInt8Linear
torch.set_num_threads(2)
torch.manual_seed(0)
out = {"threads": 2, "rows": {}}
for (N, K) in ((4864, 896), (896, 4864), (1152, 896)):
    lin = torch.nn.Linear(K, N, bias=False)
    w = lin.weight.detach()
    g = 32
    wg = w.view(N, K // g, g)
    mn, mx = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = ((mx - mn) / 15).clamp(min=1e-6)
    q = ((wg - mn) / scale).round().clamp(0, 15).to(torch.int32).view(N, K)
    zero = mn + 8 * scale
    sz = torch.stack([scale.view(N, K // g), zero.view(N, K // g)], -1).transpose(0, 1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8)
    row8 = RowInt8Linear(lin, keep_weight=False)
    def t(f, x, reps=30):
        for _ in range(5): f(x)
        t0 = time.perf_counter()
        for _ in range(reps): f(x)
        return (time.perf_counter() - t0) / reps * 1e3
    for rows in (1, 8, 16, 32):
        x = torch.randn(rows, K)
        xb = x.bfloat16()
        r = {"int4_bf16_act_ms": t(lambda a: torch.ops.aten._weight_int4pack_mm_for_cpu(a, packed, g, sz.bfloat16()), xb),
             "int4_f32_act_ms": t(lambda a: torch.ops.aten._weight_int4pack_mm_for_cpu(a, packed, g, sz), x, reps=5),
             "row_int8_ms": t(row8, x), "f32_ms": t(lin, x)}
        out["rows"][f"{N}x{K}@{rows}"] = r
        print(N, K, rows, {k: round(v, 3) for k, v in r.items()}, flush=True)
    x = torch.randn(16, K).bfloat16()
    full = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, g, sz.bfloat16())
    out.setdefault("row_invariant", []).append(all(torch.equal(torch.ops.aten._weight_int4pack_mm_for_cpu(x[i:i+1], packed, g, sz.bfloat16())[0], full[i]) for i in range(16)))
import os
out["load"] = list(os.getloadavg())
print(out["row_invariant"], out["load"])
json.dump(out, open(sys.argv[1], "w"), indent=1)
