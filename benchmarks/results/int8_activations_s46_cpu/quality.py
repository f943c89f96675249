"""How far an int8 target is from its float32 weights, with each activation row in one int8 level (the rule up
to session 45) and in two (cpu_kernels.row_int8_matmul since session 46), on held-out prompts: teacher-forced
top-1 agreement and KL(float32 || int8) per token over float32's own greedy continuation, and the relative error
of every decoder layer's hidden state (the DFlash drafter reads layers 7, 13 and 23 of the 0.5B).

    python3 benchmarks/results/int8_activations_s46_cpu/quality.py [--target qwen-coder-0.5b] [--tokens 48]
"""
import argparse
import copy
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch  # noqa: E402

from cure_core import cpu_kernels, load  # noqa: E402
from cure_core.cpu_kernels import ROW_STEP, ROW_ZERO, int8_target  # noqa: E402
from cure_tasks import load_set, raw_by_default  # noqa: E402

TWO_LEVELS = cpu_kernels.row_int8_matmul


def one_level(rows, packed, bias=None):
    """The rule before session 46: each row on the grid once."""
    scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        (rows / scale).contiguous(), ROW_STEP, ROW_ZERO, packed).mul_(scale)
    return y if bias is None else y.add_(bias)


def prompts(m, per_set: int) -> list[list[int]]:
    out = []
    for spec in ("humaneval@20", "gsm8k", os.path.join("benchmarks", "prompts", "chat20.jsonl")):
        _, task, problems = load_set(spec, per_set)
        out += [m.encode(p.prompt, chat=not raw_by_default(task)) for p in problems]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen-coder-0.5b")
    ap.add_argument("--prompts", type=int, default=6, help="per set (HumanEval 21.., GSM8K, chat20)")
    ap.add_argument("--tokens", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(2)
    m = load(target=args.target, strategy="ar", dtype="float32", kernels="eager", draft="")
    model = m.engine.pair.target
    seqs, refs = [], []
    with torch.inference_mode():
        for ids in prompts(m, args.prompts):
            out = [t for b in m.engine.generate(ids, m.config_for(strategy="ar", max_new_tokens=args.tokens))
                   for t in b.emitted]
            seqs.append((ids, out))
            o = model(torch.tensor([ids + out]), output_hidden_states=True)
            refs.append((o.logits[0, len(ids) - 1:-1].float(), [h[0].float() for h in o.hidden_states]))
        q = copy.deepcopy(model)
        int8_target(q)
        report = {"target": args.target, "prompts": len(seqs), "tokens": sum(len(o) for _, o in seqs)}
        for name, rule in (("one level", one_level), ("two levels", TWO_LEVELS)):
            cpu_kernels.row_int8_matmul = rule                 # what RowInt8Linear.forward calls
            agree = tot = 0
            kl = 0.0
            err = None
            for (ids, out), (ref, hid) in zip(seqs, refs):
                o = q(torch.tensor([ids + out]), output_hidden_states=True)
                lg = o.logits[0, len(ids) - 1:-1].float()
                agree += int((lg.argmax(-1) == ref.argmax(-1)).sum())
                tot += len(out)
                kl += float(torch.nn.functional.kl_div(lg.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                                       reduction="sum"))
                rel = [float(((h.float() - r).norm(dim=-1) / r.norm(dim=-1).clamp(min=1e-12)).median())
                       for h, r in zip(o.hidden_states, hid)]
                err = rel if err is None else [a + b for a, b in zip(err, rel)]
            report[name] = {"top1_agreement": round(agree / tot, 4), "kl_per_token": round(kl / tot, 5),
                            "hidden_rel_err_median_by_layer": [round(e / len(seqs), 4) for e in err]}
            print(name, report[name]["top1_agreement"], report[name]["kl_per_token"], flush=True)
        cpu_kernels.row_int8_matmul = TWO_LEVELS
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
