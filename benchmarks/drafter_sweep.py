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
`parallel` over the block drafter. `--auto` runs `--v-max auto` at K = 16 instead and reports decode
tokens/s too (prefill excluded), and `ar`'s (time it alone on a quiet machine). `--target ALIAS [--dtype int8]`
runs the SYNTHETIC drafters over that embedded model instead of the tiny target (a real model's cost per
forward: what tokens/s at auto needs), on `--prompts` held-out HumanEval and chat20 prompts each. `--real ALIAS`
runs the embedded model drafting for itself (AR; float32: the exact target, and int8) on the same held-out
prompts at `--budgets`.
"""
from __future__ import annotations

import copy
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from synthetic_drafter import Profile, SyntheticDrafter, profile_for_tau  # noqa: E402

from cure_core.config import DecodeConfig  # noqa: E402
from cure_core.engine import Engine, ModelPair, generate_ids  # noqa: E402
from cure_core.options import EngineArgs  # noqa: E402
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
    sizes = []                                   # tokens each block emitted
    decode_ms = 0.0                              # the blocks' own time (prefill excluded, as bench and peers.py)
    for prompt, ref in zip(prompts, refs):
        if synthetic is not None:
            synthetic.expect(prompt + ref)
        out = []
        for b in engine.generate(prompt, cfg):
            out.extend(b.emitted)
            sizes.append(len(b.emitted))
            decode_ms += b.timings.total_ms
        if out != ref:
            raise SystemExit(f"LOSSLESS FAILURE: {cfg.strategy} differs from ar on {prompt[:8]}")
    tokens, blocks = sum(sizes), len(sizes)
    # tau's standard error over blocks (the blocks of one run are not independent draws: a rough guide to
    # what "within noise" means at this many tokens)
    se = float(np.std(sizes, ddof=1) / math.sqrt(blocks)) if blocks > 1 else 0.0
    return {"tau": tokens / blocks, "tau_se": se, "tokens": tokens, "blocks": blocks, "tok_s": 1e3 * tokens / decode_ms}


def tiny_drafters(target: torch.nn.Module) -> dict:
    return {"copy x1": scaled_copy(target, 1.0), "copy x0.3": scaled_copy(target, 0.3),
            "copy x0.1": scaled_copy(target, 0.1), "perturbed": perturbed_copy(target, noise=0.3, seed=1)}


def references(pair: ModelPair, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    ar = DecodeConfig.of(strategy="ar", max_new_tokens=tokens, stop_at_eos=False)
    return [generate_ids(pair, ar, p) for p in prompts]


def held_out(loaded, per_set: int) -> tuple[list[list[int]], list[str]]:
    """`per_set` held-out prompts from HumanEval 21.. and chat20, encoded as `cure bench` encodes them."""
    from cure_tasks import load_set, raw_by_default
    prompts, names = [], []
    for spec in ("humaneval@20", os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts", "chat20.jsonl")):
        name, task, problems = load_set(spec, per_set)
        prompts += [loaded.encode(p.prompt, chat=not raw_by_default(task)) for p in problems]
        names += [f"{name}:{i}" for i in range(len(problems))]
    return prompts, names


def real_target(alias: str, dtype: str):
    """The embedded model alone (float32 or int8), opened as `cure generate` opens it."""
    from cure_core.api import open_pair
    return open_pair(EngineArgs(target=alias, strategy="ar", dtype=dtype), strategies=["ar"])


def real_pairs(alias: str, per_set: int) -> tuple[dict[str, ModelPair], list[list[int]], list[str]]:
    """The embedded float32 model with itself as its AR draft (a second float32 copy: the exact target) and
    with its int8 copy (--draft-dtype int8: right on most rows), and `per_set` held-out prompts from
    HumanEval 21.. and chat20, encoded as `cure bench` encodes them."""
    from cure_core.api import open_pair
    args = EngineArgs(target=alias, draft=alias, drafter="ar", strategy="sd", dtype="float32", draft_dtype="float32")
    exact = open_pair(args, strategies=["sd", "cure", "ddtree"])
    int8 = open_pair(args.with_(draft_dtype="int8"), strategies=["sd", "cure", "ddtree"], target_of=exact)
    prompts, names = held_out(exact, per_set)
    return {f"{alias} itself (AR)": exact.pair, f"{alias} int8 copy (AR)": int8.pair}, prompts, names


def sweep(args) -> dict:
    budgets = [int(b) for b in args.budgets.split(",")]
    methods = [m for m in METHODS if m in common_list(args.only)]
    rows = []
    if args.real:
        pairs, prompts, names = real_pairs(args.real, args.prompts)
        refs = references(next(iter(pairs.values())), prompts, args.tokens)
        for name, pair in pairs.items():
            rows += budget_rows(name, lambda pair=pair: (pair, None), False, budgets, methods, prompts, refs, args)
        return {"rows": rows, "threads": torch.get_num_threads(), "load": common.load_average(),
                "tokens": args.tokens, "prompts": names}
    if args.target:
        # the SYNTHETIC drafters over a real target: its cost per forward is a real model's (tokens/s at auto)
        loaded = real_target(args.target, args.dtype)
        target, vocab, eos = loaded.pair.target, loaded.pair.target.config.vocab_size, loaded.pair.eos_ids
        prompts, names = held_out(loaded, args.prompts)
    else:
        target, vocab, eos = tiny_target(seed=0), BYTE_VOCAB, ()
        prompts = [list(p.encode()) for p in PROMPTS[: args.prompts]]
        names = len(prompts)
    refs = references(ModelPair(target=target, eos_ids=eos), prompts, args.tokens)
    drafters: list[tuple[str, object, bool]] = []
    if "tiny" in args.kinds:
        drafters += [(name, model, False) for name, model in tiny_drafters(target).items()]
    if "synthetic" in args.kinds:
        for tau in (2.0, 4.0, 7.0):
            for c in (0.5, 2.0):
                drafters.append((f"SYNTHETIC tau {tau:g} c {c:g}", Profile(profile_for_tau(tau, 16), confidence=c), True))
    ar_tok_s = None
    if args.auto:                       # what drafting is measured against: the target alone
        ar_cfg = DecodeConfig.of(strategy="ar", max_new_tokens=args.tokens, stop_at_eos=False)
        ar_tok_s = run_one(ModelPair(target=target, eos_ids=eos), prompts, refs, ar_cfg)["tok_s"]
    for name, what, block in drafters:
        if block:
            def make(what=what):
                synthetic = SyntheticDrafter(what, vocab, 16)
                return ModelPair(target=target, drafter=synthetic, eos_ids=eos), synthetic
        else:                                                     # one AR drafter: every method
            def make(what=what):
                return build_pair(target, what, drafter="ar", vocab_size=vocab)[0], None
        rows += budget_rows(name, make, block, budgets, methods, prompts, refs, args, ar_tok_s)
    return {"rows": rows, "threads": torch.get_num_threads(), "load": common.load_average(),
            "tokens": args.tokens, "prompts": names, "target": args.target or "tiny", "dtype": args.dtype}


def budget_rows(name: str, make, block: bool, budgets: list[int], methods: list[str], prompts: list[list[int]],
                refs: list[list[int]], args, ar_tok_s: float | None = None) -> list[dict]:
    """One drafter's rows: per budget (or `--v-max auto` at K = 16), every method run on a fresh pair from
    `make() -> (ModelPair, SyntheticDrafter or None)`."""
    rows = []
    for budget in (["auto"] if args.auto else budgets):
        k = 16 if args.auto else min(16, budget + 1)
        base = (DecodeConfig.from_user(k=k, v_max="auto", max_new_tokens=args.tokens, stop_at_eos=False) if args.auto
                else DecodeConfig.of(k=k, v_max=budget, max_new_tokens=args.tokens, stop_at_eos=False))
        row = {"drafter": name, "budget": budget, "k": k}
        if ar_tok_s is not None:
            row["ar_tok_s"] = ar_tok_s
        for method in methods:
            strategy, extra = strategy_of(method, block)
            pair, synthetic = make()
            row[method] = run_one(pair, prompts, refs, base.with_(strategy=strategy, **extra), synthetic)
        rows.append(finish(row, methods, args.auto))
    return rows


def finish(row: dict, methods: list[str], auto: bool) -> dict:
    """cure's tau over the best other method's (and over tok/s at `--v-max auto`), printed as a line."""
    others = [m for m in methods if m != "cure"]
    if "cure" in row and others:
        row["cure_over_best"] = row["cure"]["tau"] / max(row[m]["tau"] for m in others)
        if auto:
            row["cure_tok_s_over_best"] = row["cure"]["tok_s"] / max(row[m]["tok_s"] for m in others)
    print(f"{row['drafter']:28s} V={row['budget']!s:>4} K={row['k']:2d}  "
          + (f"ar ({row['ar_tok_s']:.1f} tok/s)  " if "ar_tok_s" in row else "") + "  ".join(
        f"{m} {row[m]['tau']:.2f}±{row[m]['tau_se']:.2f}" + (f" ({row[m]['tok_s']:.1f} tok/s)" if auto else "")
        for m in methods)
        + (f"  cure/best {row['cure_over_best']:.3f}" if "cure_over_best" in row else "")
        + (f", tok/s {row['cure_tok_s_over_best']:.3f}" if "cure_tok_s_over_best" in row else ""), flush=True)
    return row


def common_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> dict:
    ap = common.parser(__doc__)
    ap.add_argument("--budgets", default="8,16,32", help="fixed node budgets")
    ap.add_argument("--tokens", type=int, default=480, help="tokens per prompt")
    ap.add_argument("--prompts", type=int, default=6, help="held-out prompts (at most 6; with --real: per set)")
    ap.add_argument("--only", default=",".join(METHODS), help="methods: " + ",".join(METHODS))
    ap.add_argument("--kinds", default="tiny,synthetic", help="drafters: tiny (copies, perturbed), synthetic")
    ap.add_argument("--auto", action="store_true", help="--v-max auto (tokens/s; time it alone)")
    # --target (the SYNTHETIC drafters over it instead of the tiny target) and its --dtype: EngineArgs' flags
    EngineArgs.add_cli_args(ap, only=("target", "dtype"), dtype="float32")
    ap.add_argument("--real", metavar="ALIAS", help="instead: this embedded model drafting for itself (AR; "
                    "float32 and int8), --prompts held-out HumanEval and chat20 prompts each, at --budgets")
    common.add_threads(ap, default=1)
    common.add_json(ap)
    args = common.check(ap, ap.parse_args(argv))
    if args.real and (args.auto or args.target):
        ap.error("--real runs its own pairs at fixed budgets; leave out --auto and --target")
    if args.target and "tiny" in common_list(args.kinds):
        ap.error("--target runs the SYNTHETIC drafters only: add --kinds synthetic")
    if args.prompts < 1 or (not args.real and args.prompts > len(PROMPTS)):
        ap.error(f"--prompts must lie in [1, {len(PROMPTS)}]")
    if args.tokens < 1:
        ap.error("--tokens must be >= 1")
    common.set_threads(args.threads)
    report = sweep(args)
    common.write_json(args.json, report)
    return report


if __name__ == "__main__":
    common.entry(main)
