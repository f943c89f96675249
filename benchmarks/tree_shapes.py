"""Which tree of V nodes would have accepted the most? Tree shapes replayed exactly on recorded blocks.

Every strategy is lossless, so the target's greedy continuation after any block's root is simply
the rest of the final output: the truth every tree is judged against, with no second target run. This
script records, at every block of a real generation, the drafter's proposal (as wide as the largest
budget) AND its re-drafted continuations under every substitution any replayed shape asks for (one
batched pass per block, memoised by prefix). Cutting a proposal to fewer rows or columns, and a
re-draft to fewer rows, gives exactly what the engine would have computed with less (DFlash always
drafts its trained block; PARD is causal; an AR draft's chain is greedy), so each shape below is
replayed as the engine builds it, at every budget V:

  chain             branch 0 cut to V nodes (parallel; and any tree at V <= K-1 that keeps branch 0)
  ddtree            strategies.build_ddtree (the reference best-first rule)
  cure-paper        strategies.build_cure_tree: branch 0 + repairs at UFPs, suffixes re-drafted
  cure-best-first   strategies.build_cure_best_first with `redrafts` R (--redrafts: R values to compare)
  cure-best-first-stopP   the same over a sequential (AR chain) drafter that stops drafting once its
                    chain's joint draft probability falls below P (--draft-stop: the engine's draft_stop,
                    which the budget tuner sets per block from measured costs; here a fixed P per shape),
                    the budget it leaves going to width and re-drafted repairs

A block's tree accepts the longest path that follows the truth; a path still matching where the
output ended is counted and reported as censored.

    python benchmarks/tree_shapes.py --k 8 --limit 20 --max-new-tokens 48 \\
        --json benchmarks/results/tree_shapes_qwen05b_k8.json            # the default pair
    python benchmarks/tree_shapes.py --target qwen-coder-1.5b --k 8 ...  # the 1.5B pair
    python benchmarks/tree_shapes.py --tiny                              # smoke run on tiny random models
"""
from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cure_core.files import atomic_write_json  # noqa: E402
from cure_core.config import DecodeConfig
from cure_core.drafters.base import Proposal, proposals
from cure_core.options import EngineArgs, parse_list
from cure_core.strategies import build_cure_best_first, build_cure_tree, build_ddtree, proposal_width
from cure_core.tree import DraftTree

TINY_PROMPTS = ["def fibonacci(n):\n    ", "import os\n\ndef list_files(path):\n", "class Stack:\n    def push(",
                "for i in range(10):\n", "def add(a, b):\n    return"]
PAPER_WIDTH = 8


def cut(p: Proposal, rows: int, cols: int) -> Proposal:
    return Proposal(tokens=p.tokens[:rows], top_ids=p.top_ids[:rows, :cols], top_logprobs=p.top_logprobs[:rows, :cols])


class Memo:
    """A drafter's re-drafts answered from a block's recording (prefix -> the widest, longest re-draft).
    `redrafts_while_drafting`: the recorded drafter's, so best-first cure picks its substitutions by the
    same rule (a causal chain drafter's chain_substitutions)."""

    def __init__(self, table: dict[tuple[int, ...], Proposal], redrafts_while_drafting: bool = False):
        self.table = table
        self.redrafts_while_drafting = redrafts_while_drafting

    def redraft_topk(self, prefixes, lengths, top_k):
        return [cut(self.table[tuple(p)], n, top_k) for p, n in zip(prefixes, lengths)]

    def redraft(self, prefixes, lengths):
        return [r.tokens for r in self.redraft_topk(prefixes, lengths, 1)]


class Collector:
    """Answers re-drafts with placeholders while recording which prefixes a shape asks for."""

    def __init__(self, width: int, redrafts_while_drafting: bool = False):
        self.asked: set[tuple[int, ...]] = set()
        self.width = width
        self.redrafts_while_drafting = redrafts_while_drafting

    def redraft_topk(self, prefixes, lengths, top_k):
        self.asked.update(tuple(p) for p in prefixes)
        ids = torch.arange(top_k).expand(max(lengths, default=0), top_k)
        logp = -1.0 - torch.arange(top_k, dtype=torch.float32).expand_as(ids)
        return [Proposal(ids[:n, 0].tolist(), ids[:n], logp[:n]) for n in lengths]

    def redraft(self, prefixes, lengths):
        return [r.tokens for r in self.redraft_topk(prefixes, lengths, 1)]


@dataclass(frozen=True)
class Shape:
    name: str
    redrafts: int | None = None   # cure best-first: substitutions re-drafted per block
    weight: float = 1.0           # cure best-first: the re-draft's weight in the blend (strategies.mix)
    short: bool = False           # replay the proposal of a block drafted with only V masks (--short-blocks)
    stop: float | None = None     # cure best-first over a sequential drafter: stop drafting below this chain prob


def stop_rows(p: Proposal, rows: int, stop: float) -> int:
    """Rows a sequential drafter drafts of `rows` when it stops once its chain's joint draft probability
    falls below `stop` (ArDrafter.propose_with_redrafts with stop_logp = log stop): row 0 always, row d
    while the joint log-prob of rows 0..d-1 is at least log stop."""
    floor, joint = math.log(stop), 0.0
    for d in range(rows):
        if d > 0 and joint < floor:
            return d
        joint += float(p.top_logprobs[d, 0])
    return rows


def shape_rows(shape: Shape, p: Proposal, v: int, drafter) -> int:
    """Positions the drafter drafts for `shape` at budget v: budgets <= K-1 draft v positions; a stopping
    shape over a sequential drafter stops sooner (stop_rows). Over a sequential drafter each is one step."""
    rows = min(len(p.tokens), v)
    if shape.stop is not None and shape.name not in ("chain", "chain-short") \
            and getattr(drafter, "redrafts_while_drafting", False):
        rows = stop_rows(p, rows, shape.stop)             # the engine stops only sequential drafters
    return rows


def shape_tree(shape: Shape, base: DecodeConfig, p: Proposal, v: int, drafter) -> DraftTree:
    """The tree `shape` builds at budget v from the full-depth proposal p, as the engine would: budgets
    <= K-1 draft (and keep) v positions, best-first trees take max(top_k, v) candidates each."""
    rows = shape_rows(shape, p, v, drafter)
    if shape.name in ("chain", "chain-short"):
        tree = DraftTree()
        tree.add_path(p.tokens[:rows], branch=0)
        return tree
    cfg = base.with_(k=rows + 1, v_max=v)                  # the tree is at most `rows` deep either way
    if shape.name in ("ddtree", "ddtree-short"):
        return build_ddtree(cfg.with_(strategy="ddtree"), cut(p, rows, proposal_width(cfg.with_(strategy="ddtree"), v)))
    if shape.name == "cure-paper":
        return build_cure_tree(cfg.with_(strategy="cure", cure_tree="paper"), cut(p, rows, PAPER_WIDTH), drafter).tree
    cfg = cfg.with_(strategy="cure", cure_tree="best-first", redrafts=shape.redrafts, redraft_weight=shape.weight)
    return build_cure_best_first(cfg, cut(p, rows, proposal_width(cfg, v)), drafter).tree


@dataclass(frozen=True)
class Recorded:
    proposal: Proposal                        # full depth, width = the largest budget
    redrafts: dict                            # prefix -> re-draft (full length, full width)
    truth: tuple[int, ...]                    # the output after the root, up to the block's depth
    complete: bool                            # the truth reaches the full depth (not cut by the end)
    accepted: int                             # what the recording engine accepted
    recorded_tree: int                        # its tree size
    set: str = ""                             # the prompt set the block's prompt came from
    short: dict = field(default_factory=dict)  # v -> the proposal of a block drafted with only v masks (--short-blocks)
    chained: bool = False                     # the drafter re-drafts while drafting (a causal chain: ArDrafter)

    def memo(self) -> Memo:
        return Memo(self.redrafts, self.chained)


class Recorder:
    """The engine's drafter, keeping each proposal wide and every re-draft the shapes will ask for."""

    def __init__(self, drafter, shapes, budgets, base: DecodeConfig, check: bool = False, short: bool = False):
        self.inner, self.shapes, self.budgets, self.base = drafter, shapes, budgets, base
        self.width = max(max(budgets), base.top_k)
        self.blocks: list[tuple[Proposal, dict]] = []
        self.short: list[dict] = []             # per block: v -> proposal drafted from a block of v masks
        self.want_short = short
        self.check = check                      # rebuild every shape with the live drafter and compare
        self.checked = self.differ = 0
        self.chained = bool(getattr(drafter, "redrafts_while_drafting", False))

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def short_blocks(self, root: int, n: int) -> dict:
        """What the drafter would propose had it drafted only v masks (#13 item 2: the engine no longer does
        this; DFlash attends bidirectionally inside a block, so a shorter block changes every logit). Only
        for drafters with a stateless block forward (DFlash); PARD is causal, so its first v rows never
        depend on the masks after them."""
        if not hasattr(self.inner, "forward_blocks"):
            return {}
        short = [v for v in self.budgets if v < n]
        rows = [self.inner.forward_blocks([[root] + [self.inner.mask_token_id] * v])[0][1:1 + v] for v in short]
        return dict(zip(short, proposals(rows, self.width, self.inner.to_target_ids))) if short else {}

    def propose(self, root: int, n: int, top_k: int) -> Proposal:
        p = self.inner.propose(root, n, max(top_k, self.width))
        collect = Collector(self.width, self.chained)
        for shape in self.shapes:                   # which prefixes does any shape re-draft?
            for v in self.budgets:
                if shape.name.startswith("cure"):
                    shape_tree(shape, self.base, p, v, collect)
        asked = sorted(collect.asked)
        got = self.inner.redraft_topk([list(a) for a in asked], [n - len(a) for a in asked], self.width) if asked else []
        self.blocks.append((p, dict(zip(asked, got))))
        self.short.append(self.short_blocks(root, n) if self.want_short else {})
        if self.check:                          # the memo answers as the live drafter would
            for shape in self.shapes:
                for v in self.budgets:
                    a = shape_tree(shape, self.base, p, v, Memo(self.blocks[-1][1], self.chained))
                    b = shape_tree(shape, self.base, p, v, self.inner)
                    self.checked += 1
                    self.differ += (a.tokens, a.parents) != (b.tokens, b.parents)
        return cut(p, n, top_k)


def record(pair, prompts, cfg: DecodeConfig, shapes, budgets, progress=lambda i: None,
           check: dict | None = None, short: bool = False) -> list[Recorded]:
    from cure_core.engine import Engine
    rec = Recorder(pair.drafter, shapes, budgets, cfg, check=check is not None, short=short)
    pair.drafter = rec
    out: list[Recorded] = []
    try:
        engine = Engine(pair)
        for i, (set_name, ids) in enumerate(prompts):
            start = len(rec.blocks)
            every = list(engine.generate(ids, cfg))
            sequence = list(ids) + [t for b in every for t in b.emitted]
            blocks = [b for b in every if b.draft]
            for b, (p, memo), short in zip(blocks, rec.blocks[start:], rec.short[start:]):
                at = b.context_len + 1                     # the root sits at context_len
                truth = tuple(sequence[at: at + len(p.tokens)])
                out.append(Recorded(p, memo, truth, len(truth) == len(p.tokens), b.accept_length, b.tree_size,
                                    set_name, short, rec.chained))
            progress(i)
    finally:
        pair.drafter = rec.inner
        if check is not None:
            check.update(trees=rec.checked, differ=rec.differ)
    return out


def accept(tree: DraftTree, truth, complete: bool) -> tuple[int, bool]:
    """(tokens accepted, censored): walk the tree along the truth while it is known."""
    children: dict[int, dict[int, int]] = {}
    for i, (tok, par) in enumerate(zip(tree.tokens, tree.parents)):
        children.setdefault(par, {})[tok] = i
    node, n = -1, 0
    for tok in truth:
        node = children.get(node, {}).get(tok)
        if node is None:
            return n, False
        n += 1
    return n, (not complete) and node in children        # it had children past the known truth


def proposal_for(shape: Shape, r: Recorded, v: int) -> Proposal:
    """`chain-short` / `ddtree-short` replay the block drafted with only v masks, where one was recorded."""
    return r.short.get(v, r.proposal) if shape.short else r.proposal


def replay(records: list[Recorded], shapes, budgets, base: DecodeConfig) -> dict:
    accepted, censored, sizes, drafted = {}, {}, {}, {}
    for shape in shapes:
        for v in budgets:
            got = [accept(t := shape_tree(shape, base, p := proposal_for(shape, r, v), v, r.memo()), r.truth,
                          r.complete) + (len(t), shape_rows(shape, p, v, r.memo())) for r in records]
            accepted[(shape.name, v)] = statistics.mean(a for a, _, _, _ in got)
            censored[(shape.name, v)] = sum(c for _, c, _, _ in got)
            sizes[(shape.name, v)] = statistics.mean(s for _, _, s, _ in got)
            drafted[(shape.name, v)] = statistics.mean(d for _, _, _, d in got)
    names = [s.name for s in shapes]
    return {"blocks": len(records), "budgets": list(budgets),
            "accepted": {n: [accepted[(n, v)] for v in budgets] for n in names},
            "tree_size": {n: [sizes[(n, v)] for v in budgets] for n in names},
            # positions drafted a block: sequential steps over an AR chain (what a draft stop saves)
            "drafted": {n: [drafted[(n, v)] for v in budgets] for n in names},
            "censored": {n: [censored[(n, v)] for v in budgets] for n in names}}


def record_run(args, shapes, budgets, check):
    """Load the pair as `cure generate` would, generate over the prompt sets, record every block."""
    from cure_core.api import open_pair
    engine_args = EngineArgs.from_cli_args(args).with_(strategy="parallel")
    if engine_args.draft_dtype == "auto":
        # Rule: the replay answers re-drafts from one batched call per block, so it is exact only where a row's
        # draft does not depend on the rows batched with it: true of float32, not of packed bfloat16 GEMMs
        # (whose kernels change with the row count). auto here is the target's dtype, not bfloat16.
        engine_args = engine_args.with_(draft_dtype=engine_args.dtype)
    with tempfile.TemporaryDirectory(prefix="cure-shapes-") as tmp:
        if args.tiny:
            from cure_core.tiny import save_tiny_pair
            tdir, ddir = save_tiny_pair(Path(tmp))               # --drafter ar: the copy as an AR chain
            engine_args = engine_args.with_(target=str(tdir), draft=str(ddir),
                                            drafter="ar" if args.drafter == "ar" else "pard")
        loaded = open_pair(engine_args)
        if loaded.pair.drafter is None:
            raise SystemExit("tree_shapes needs a drafter for the target (--draft)")
        if args.tiny:
            prompts = [("tiny", loaded.encode(t, chat=False)) for t in TINY_PROMPTS[: args.limit]]
        else:
            from cure_tasks import load_set, raw_by_default
            prompts = []
            for spec in parse_list(args.sets):
                name, task, problems = load_set(spec, args.limit)
                prompts += [(name, loaded.encode(q.prompt, chat=not raw_by_default(task))) for q in problems]
        k = loaded.config.k
        # the recording engine: branch 0 only, at the full block, so every block is drafted whole
        cfg = loaded.config.with_(strategy="parallel", v_max=k - 1, auto_budget=False, stop_at_eos=True)
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task("recording blocks", total=len(prompts))
            records = record(loaded.pair, prompts, cfg, shapes, budgets, progress=lambda i: bar.advance(task),
                             check=check, short=args.short_blocks)
    meta = {"target": "tiny" if args.tiny else loaded.pair.names.get("target"),
            "draft": "tiny" if args.tiny else loaded.pair.names.get("draft"), "drafter": loaded.drafter_kind,
            "prompts": len(prompts), "sets": ["tiny"] if args.tiny else parse_list(args.sets),
            "max_new_tokens": args.max_new_tokens}
    return records, cfg, meta


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny random models and built-in prompts (smoke run)")
    ap.add_argument("--sets", default="humaneval", help="comma list of tasks, TASK@N (skip its first N), or prompt "
                    ".jsonl files (cure_tasks.load_set)")
    ap.add_argument("--limit", type=int, default=20, help="prompts per set")
    ap.add_argument("--budgets", default="3,5,8,16,32,64")
    ap.add_argument("--redrafts", default="1,2,4", help="cure best-first: re-drafted substitutions per block to compare "
                    "(R, or R@W with W the re-draft's weight in the blend, strategies.mix)")
    ap.add_argument("--draft-stop", default="", help="cure best-first over an AR chain drafter: chain probabilities P "
                    "below which drafting stops (comma list, P or P@R with R re-drafts, default R 3, the AR drafter's "
                    "own count); one cure-best-first-stopP shape each")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="OUT.json")
    ap.add_argument("--save-records", default=None, metavar="FILE.pt", help="keep the recorded blocks (torch.save)")
    ap.add_argument("--load-records", default=None, metavar="FILE.pt", help="replay blocks recorded earlier; no model runs")
    ap.add_argument("--short-blocks", action="store_true", help="also record, for every V below the block, the "
                    "proposal of a block drafted with only V masks (what the engine did before #13), and replay "
                    "chain-short / ddtree-short from it (DFlash drafters)")
    ap.add_argument("--check", action="store_true", help="also rebuild every replayed tree with the live drafter "
                    "while recording and count differences (slow; the replay's exactness check)")
    EngineArgs.add_cli_args(ap, exclude=("strategy", "temperature", "seed", "v_max", "chat"), k=8, max_new_tokens=48)
    args = ap.parse_args(argv)
    args.stops = []                                        # --draft-stop as (spec, P, R)
    for spec in parse_list(args.draft_stop):
        stop, _, r = spec.partition("@")
        try:
            parsed = (spec, float(stop), int(r) if r else 3)
        except ValueError:
            parsed = None
        if parsed is None or not 0.0 < parsed[1] < 1.0 or parsed[2] < 0:
            ap.error(f"--draft-stop {spec!r}: want P or P@R, with 0 < P < 1 and R >= 0")
        args.stops.append(parsed)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    shapes = [Shape("chain"), Shape("ddtree"), Shape("cure-paper")] + (
        [Shape("chain-short", short=True), Shape("ddtree-short", short=True)] if args.short_blocks else []) + [
        Shape(f"cure-best-first-r{spec}", int(spec.split("@")[0]), float(spec.split("@")[1]) if "@" in spec else 1.0)
        for spec in args.redrafts.split(",")] + [
        Shape(f"cure-best-first-stop{spec}", r, stop=stop) for spec, stop, r in args.stops]
    check = {} if args.check else None
    if args.load_records:
        saved = torch.load(args.load_records, weights_only=False)
        records, cfg, meta = saved["records"], saved["config"], saved["meta"]
    else:
        records, cfg, meta = record_run(args, shapes, budgets, check)
        if args.save_records:
            torch.save({"records": records, "config": cfg, "meta": meta}, args.save_records)
    k = cfg.k
    rep = {**meta, "k": k, **replay(records, shapes, budgets, cfg)}
    sets = sorted({r.set for r in records})
    if len(sets) > 1:
        rep["per_set"] = {name: replay([r for r in records if r.set == name], shapes, budgets, cfg) for name in sets}
    if check is not None:
        rep["check"] = check
    chain = rep["accepted"]["chain"][-1] if budgets[-1] >= k - 1 else None
    rep["replay_matches_engine"] = sum(accept(shape_tree(Shape("chain"), cfg, r.proposal, k - 1, None), r.truth,
                                              r.complete)[0] == r.accepted for r in records)
    print(f"{rep['blocks']} blocks; the chain replay equals the engine's acceptance on {rep['replay_matches_engine']}"
          + ("" if chain is None else f"; chain at K-1 accepts {chain:.3f}"))
    print("mean accepted tokens per block (tau - 1)")
    print("V      " + "".join(f"{name:>20}" for name in rep["accepted"]))
    for title, part in [("all sets", rep)] + sorted((rep.get("per_set") or {}).items()):
        print(f"{title}: {part['blocks']} blocks")
        for j, v in enumerate(budgets):
            print(f"{v:<7}" + "".join(f"{part['accepted'][name][j]:20.3f}" for name in part["accepted"]))
    if args.stops:
        print("positions drafted a block (a sequential drafter's steps), all sets")
        for j, v in enumerate(budgets):
            print(f"{v:<7}" + "".join(f"{rep['drafted'][name][j]:20.3f}" for name in rep["drafted"]))
    if args.json:
        atomic_write_json(args.json, rep, indent=2)
        print(f"wrote {args.json}")
    return rep


if __name__ == "__main__":
    main()
