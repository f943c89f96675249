"""Does a tree rule hold across drafter quality? tau of the chain, ddtree, the paper tree and best-first cure at
fixed budgets, from weak drafters to perfect ones (#57's sweep).

Drafters, each with one tiny random Qwen3 target (float32, 1 thread by default):
  copy x1, x0.3, x0.1   the target itself as an AR draft, its logits scaled: the same argmax, flatter
                        (right but unsure: the regime where a joint-draft-probability ranking loses depth)
  perturbed             the target with Gaussian noise on its weights (a weak drafter)
  synthetic TAU c       the SYNTHETIC block drafter (synthetic_drafter.py) told the target's output, at a chain
                        tau of TAU at K=16, reporting c x its log-probs (c < 1 under-, > 1 over-confident)
Per drafter, method and budget a fresh engine decodes every prompt in turn (its learners carry over), at
K = min(16, budget + 1); every output is checked equal to `ar`'s. The chain is `sd` over an AR drafter and
`parallel` over the block drafter. `--auto` runs `--v-max auto` instead and reports tokens/s too (time it
alone on a quiet machine). `--real ALIAS` runs the embedded model drafting for itself (AR, float32) on
held-out HumanEval and chat prompts at K=16, budget 16.
"""
from __future__ import annotations

import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from synthetic_drafter import Profile, SyntheticDrafter, profile_for_tau  # noqa: E402

from cure_core.config import DecodeConfig  # noqa: E402
from cure_core.engine import Engine, ModelPair  # noqa: E402
from cure_core.models import build_pair  # noqa: E402
from cure_core.tiny import BYTE_VOCAB, perturbed_copy, tiny_target  # noqa: E402

METHODS = ("chain", "ddtree", "paper", "cure")
# held-out byte prompts (no rule was chosen on them)
PROMPTS = ["def merge_sorted(a, b):\n    ", "The capital of France is", "for i in range(10):\n    total +=",
           "Q: Tom has 3 apples and buys 5 more. How many?\nA:", "import numpy as np\n\ndef mean(x):",
           "Once upon a time, in a small village,"]


def scaled_copy(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """The model with its logits x scale (lm_head scaled): the same argmax, flatter below 1."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.lm_head.weight.mul_(scale)
    return out.eval()


def strategy_of(method: str, block: bool) -> tuple[str, dict]:
    if method == "chain":
        return ("parallel" if block else "sd"), {}
    if method == "paper":
        return "cure", {"cure_tree": "paper"}
    return method, {}


def run_one(pair: ModelPair, prompts: list[list[int]], refs: list[list[int]], cfg: DecodeConfig, synthetic=None) -> dict:
    engine = Engine(pair)
    tokens = blocks = 0
    t0 = time.perf_counter()
    for prompt, ref in zip(prompts, refs):
        if synthetic is not None:
            synthetic.expect(prompt + ref)
        out = []
        for b in engine.generate(prompt, cfg):
            out.extend(b.emitted)
            blocks += 1
        if out != ref:
            raise SystemExit(f"LOSSLESS FAILURE: {cfg.strategy} differs from ar on {prompt[:8]}")
        tokens += len(out)
    seconds = time.perf_counter() - t0
    return {"tau": tokens / blocks, "tokens": tokens, "blocks": blocks, "tok_s": tokens / seconds}


def tiny_drafters(target: torch.nn.Module) -> dict:
    return {"copy x1": scaled_copy(target, 1.0), "copy x0.3": scaled_copy(target, 0.3),
            "copy x0.1": scaled_copy(target, 0.1), "perturbed": perturbed_copy(target, noise=0.3, seed=1)}


def sweep(args) -> dict:
    target = tiny_target(seed=0)
    prompts = [list(p.encode()) for p in PROMPTS[: args.prompts]]
    ar = DecodeConfig.of(strategy="ar", max_new_tokens=args.tokens, stop_at_eos=False)
    refs = [[t for b in Engine(ModelPair(target=target)).generate(p, ar) for t in b.emitted] for p in prompts]
    budgets = [int(b) for b in args.budgets.split(",")]
    methods = [m for m in METHODS if m in common_list(args.only)]
    rows = []
    drafters: list[tuple[str, object, bool]] = []
    if "tiny" in args.kinds:
        drafters += [(name, model, False) for name, model in tiny_drafters(target).items()]
    if "synthetic" in args.kinds:
        for tau in (2.0, 4.0, 7.0):
            for c in (0.5, 2.0):
                drafters.append((f"SYNTHETIC tau {tau:g} c {c:g}", Profile(profile_for_tau(tau, 16), confidence=c), True))
    for name, what, block in drafters:
        for budget in budgets:
            k = min(16, budget + 1)
            base = DecodeConfig.of(k=k, v_max=budget, max_new_tokens=args.tokens, stop_at_eos=False)
            if args.auto:
                base = DecodeConfig.from_user(k=k, v_max="auto", max_new_tokens=args.tokens, stop_at_eos=False)
            row = {"drafter": name, "budget": "auto" if args.auto else budget, "k": k}
            for method in methods:
                strategy, extra = strategy_of(method, block)
                cfg = base.with_(strategy=strategy, **extra)
                synthetic = None
                if block:
                    synthetic = SyntheticDrafter(what, BYTE_VOCAB, 16)
                    pair = ModelPair(target=target, drafter=synthetic)
                else:
                    pair = build_pair(target, what, drafter="ar", vocab_size=BYTE_VOCAB)[0]   # one AR drafter: every method
                row[method] = run_one(pair, prompts, refs, cfg, synthetic)
            best = max(row[m]["tau"] for m in methods if m != "cure") if len(methods) > 1 else None
            if "cure" in row and best:
                row["cure_over_best"] = row["cure"]["tau"] / best
            rows.append(row)
            print(f"{name:28s} V={row['budget']!s:>4} K={k:2d}  " + "  ".join(
                f"{m} {row[m]['tau']:.2f}" + (f" ({row[m]['tok_s']:.1f} tok/s)" if args.auto else "")
                for m in methods) + (f"  cure/best {row['cure_over_best']:.3f}" if "cure_over_best" in row else ""),
                flush=True)
            if args.auto:
                break
    return {"rows": rows, "threads": torch.get_num_threads(), "load": common.load_average(),
            "tokens": args.tokens, "prompts": len(prompts)}


def common_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--budgets", default="8,16,32", help="fixed node budgets")
    ap.add_argument("--tokens", type=int, default=96, help="tokens per prompt")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts (at most 6)")
    ap.add_argument("--only", default=",".join(METHODS), help="methods: " + ",".join(METHODS))
    ap.add_argument("--kinds", default="tiny,synthetic", help="drafters: tiny (copies, perturbed), synthetic")
    ap.add_argument("--auto", action="store_true", help="--v-max auto (tokens/s; time it alone)")
    common.add_threads(ap, default=1)
    common.add_json(ap)
    args = common.check(ap, ap.parse_args())
    if not 1 <= args.prompts <= len(PROMPTS):
        ap.error(f"--prompts must lie in [1, {len(PROMPTS)}]")
    if args.tokens < 1:
        ap.error("--tokens must be >= 1")
    common.set_threads(args.threads)
    common.write_json(args.json, sweep(args))


if __name__ == "__main__":
    common.entry(main)
