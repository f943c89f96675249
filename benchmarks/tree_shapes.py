"""Which tree of V nodes would have accepted the most? Tree shapes replayed offline on real blocks.

A block-parallel drafter (DFlash, PARD) drafts every position in ONE pass: its per-position top-k
does not depend on which tokens the tree puts above a node. So one recorded proposal, plus the
target's own tokens along the path it accepted, tells how many tokens ANY tree over those top-k
candidates would have had accepted, without running the target again. This script records blocks
from a real generation (ddtree at a large budget, so the accepted path, and with it the known
truth, reaches as deep as possible) and replays, for every budget V, the shapes:

  chain       branch 0 cut to V nodes (what parallel, and cure at budgets <= K-1, verify)
  best-first  the ddtree builder itself (strategies.build_ddtree) at v_max = V
  gated-U@T   best-first, but an alternative may only sit at a UFP, ranked within its budget b_i
              (strategies.select_ufps with max_ufps U, tau_margin T; --gates): CURE's gate applied
              to a best-first tree, no re-drafting

Not simulated: CURE's re-drafted repair suffixes (they need the drafter under each substitute).
Truth is known to the depth the recorded tree accepted plus its bonus token; a replayed tree that
would accept past that is cut there ("censored": counted, and reported).

    python benchmarks/tree_shapes.py --target qwen-coder-0.5b --draft assets/drafters/qwen-coder-0.5b \\
        --limit 20 --max-new-tokens 48 --k 8 --json benchmarks/results/tree_shapes_qwen05b.json
    python benchmarks/tree_shapes.py --tiny                      # smoke run on tiny random models
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from cure_core.config import DecodeConfig
from cure_core.drafters.base import Proposal
from cure_core.engine import Engine
from cure_core.strategies import build_ddtree, select_ufps
from cure_core.tree import DraftTree

TINY_PROMPTS = ["def fibonacci(n):\n    ", "import os\n\ndef list_files(path):\n", "class Stack:\n    def push(",
                "for i in range(10):\n", "def add(a, b):\n    return"]


@dataclass(frozen=True)
class Recorded:
    proposal: Proposal            # the drafted block's top-k (block-parallel: path-independent)
    truth: tuple[int, ...]        # truth[d-1] = the target's token at depth d, known for d <= len(truth)
    accepted: int                 # what the recorded tree had accepted
    branch0_accepted: int         # what branch 0 alone would have had accepted


class Recorder:
    """The engine's drafter, keeping the last proposal (everything else is delegated)."""

    def __init__(self, drafter):
        self.inner, self.last = drafter, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        self.last = self.inner.propose(root, n, top_k)
        return self.last


def record(pair, prompts, cfg: DecodeConfig, progress=lambda i: None) -> list[Recorded]:
    rec = Recorder(pair.drafter)
    pair.drafter = rec
    out = []
    try:
        for i, ids in enumerate(prompts):
            for block in Engine(pair, cfg).generate(ids):
                if not block.draft:
                    continue
                depth = min(len(block.emitted), len(rec.last.tokens))
                out.append(Recorded(rec.last, tuple(block.emitted[:depth]), block.accept_length,
                                    block.branch0_accepted))
            progress(i)
    finally:
        pair.drafter = rec.inner
    return out


def accept(tree: DraftTree, truth) -> tuple[int, bool]:
    """(tokens accepted, censored): walk the tree along the target's tokens while they are known."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tree.tokens, tree.parents)):
        children.setdefault(par, {})[tok] = i
    node, n = -1, 0
    for tok in truth:
        node = children.get(node, {}).get(tok)
        if node is None:
            return n, False
        n += 1
    return n, node is not None and node in children           # it had children past the known truth


def chain(p: Proposal, v: int) -> DraftTree:
    tree = DraftTree()
    tree.add_path(p.tokens[:v], branch=0)
    return tree


def ufp_gated(p: Proposal, cfg: DecodeConfig) -> DraftTree:
    """Best-first where alternatives (rank >= 1) only count at UFPs, up to their budget b_i."""
    allowed = {pos: budget for pos, _, budget in select_ufps(cfg, p.margins)}
    lp = p.top_logprobs.clone()
    for pos in range(lp.shape[0]):
        lp[pos, 1 + allowed.get(pos, 0):] = float("-inf")   # impossible: build_ddtree never grafts it
    return build_ddtree(cfg, Proposal(p.tokens, p.top_ids, lp))


def shapes(gates) -> dict:
    """name -> (proposal, cfg) -> DraftTree; one ufp-gated shape per (max_ufps, tau_margin) gate."""
    out = {"chain": lambda p, cfg: chain(p, cfg.v_max), "best-first": lambda p, cfg: build_ddtree(cfg, p)}
    for ufps, tau in gates:
        out[f"gated-{ufps}@{tau:g}"] = lambda p, cfg, u=ufps, t=tau: ufp_gated(p, cfg.with_(max_ufps=u, tau_margin=t))
    return out


def replay(records: list[Recorded], budgets, cfg: DecodeConfig, gates=((1, 1.0),)) -> dict:
    """Mean accepted tokens per block for every shape and budget, and the replay's own checks."""
    table, censored = {}, {}
    named = shapes(gates)
    for name, build in named.items():
        for v in budgets:
            at = cfg.with_(k=min(cfg.k, v + 1), v_max=v)        # K only bounds validation here
            got = [accept(build(r.proposal, at), r.truth) for r in records]
            table[(name, v)] = statistics.mean(a for a, _ in got)
            censored[(name, v)] = sum(c for _, c in got)
    # Checks: replaying the recorded shape gives what the engine accepted; branch 0 whole gives a(pi_0).
    same = sum(accept(build_ddtree(cfg, r.proposal), r.truth)[0] == r.accepted for r in records)
    b0 = sum(accept(chain(r.proposal, len(r.proposal.tokens)), r.truth)[0] == r.branch0_accepted for r in records)
    return {"blocks": len(records), "budgets": list(budgets),
            "gates": [list(g) for g in gates],
            "accepted": {name: [table[(name, v)] for v in budgets] for name in named},
            "censored": {name: [censored[(name, v)] for v in budgets] for name in named},
            "replay_matches_engine": same, "chain_matches_branch0": b0}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen-coder-0.5b")
    ap.add_argument("--draft", default="assets/drafters/qwen-coder-0.5b", help="a block-parallel drafter")
    ap.add_argument("--tiny", action="store_true", help="tiny random models and built-in prompts (smoke run)")
    ap.add_argument("--limit", type=int, default=20, help="HumanEval problems")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=8, help="block size of the recorded blocks")
    ap.add_argument("--record-v-max", type=int, default=64, help="the recorded (ddtree) tree's budget")
    ap.add_argument("--budgets", default="1,2,3,4,5,6,8,12,16,24")
    ap.add_argument("--gates", default="1:1,2:1,8:2",
                    help="UFP gates to replay, MAX_UFPS:TAU_MARGIN each (1:1 is CURE's default)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="OUT.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from cure_core.models import encode_prompt, load_pair
    with tempfile.TemporaryDirectory(prefix="cure-shapes-") as tmp:
        if args.tiny:
            from cure_core.tiny import save_tiny_pair
            tdir, ddir = save_tiny_pair(Path(tmp))
            loaded = load_pair(str(tdir), str(ddir), drafter="pard")
            texts = TINY_PROMPTS[: args.limit]
        else:
            from cure_tasks import humaneval
            loaded = load_pair(args.target, args.draft)
            texts = [p.prompt for p in humaneval.load(limit=args.limit)]
        if loaded.pair.drafter is None:
            ap.error("--draft must be a block-parallel drafter (DFlash or PARD)")
        prompts = [encode_prompt(loaded.tokenizer, t, chat=False) for t in texts]
        cfg = DecodeConfig(strategy="ddtree", k=args.k, v_max=args.record_v_max, max_new_tokens=args.max_new_tokens)
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task("recording blocks", total=len(prompts))
            records = record(loaded.pair, prompts, cfg, progress=lambda i: bar.advance(task))
    budgets = [int(b) for b in args.budgets.split(",")]
    try:
        gates = [(int(u), float(t)) for u, t in (g.split(":") for g in args.gates.split(",") if g)]
    except ValueError:
        ap.error(f"--gates wants MAX_UFPS:TAU_MARGIN pairs, got {args.gates!r}")
    rep = {"target": "tiny" if args.tiny else args.target, "draft": "tiny" if args.tiny else args.draft,
           "k": args.k, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
           **replay(records, budgets, cfg, gates)}
    print(f"{rep['blocks']} blocks; replay = engine on {rep['replay_matches_engine']}, "
          f"chain = branch 0 on {rep['chain_matches_branch0']}")
    print("mean accepted tokens per block (tau - 1)")
    print("V      " + "".join(f"{name:>13}" for name in rep["accepted"]))
    for j, v in enumerate(budgets):
        print(f"{v:<7}" + "".join(f"{rep['accepted'][name][j]:13.3f}" for name in rep["accepted"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2))
        print(f"wrote {args.json}")
    return rep


if __name__ == "__main__":
    main()
