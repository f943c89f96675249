"""A further self-distilled corpus for a drafter whose first corpus it has outgrown.

`cure train-drafter --corpus self-distill` distills the prompt mix of its own `--seed`; a run that has
seen that corpus many times needs NEW prompts, not more steps. This writes the target's greedy answers
to the prompt mix of another seed, minus every prompt of the corpora it extends (the mixes share
templates, so about one prompt in eight would repeat), into a corpus file that training takes as
`--corpus FILE.jsonl`. Same generation code and file format as train-drafter's own corpus
(cure_core/training/distill.py): resumable, rewritten atomically after every batch.

    python training/distill_more.py --target qwen-coder-1.5b --mix mixed --seed 1 --prompts 384 \\
        --exclude-seed 0 --exclude-prompts 384 --tokens 96 --batch 32 \\
        --out training/qwen-coder-1.5b-pard-full/corpus/self-distill-seed1.jsonl
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from cure_core.cpu_kernels import pack_linears, unavailable_reason
from cure_core.models import load_model, load_tokenizer
from cure_core.training.distill import distill
from cure_core.training.prompt_mix import MIXES, prompt_mix


def fresh_prompts(n: int, mix: str, seed: int, exclude_seed: int, exclude_n: int) -> list:
    """The first n prompts of the mix of `seed` (in its order) that the mix of `exclude_seed` (its first
    exclude_n) does not hold, each once."""
    excluded = {p.text for p in prompt_mix(exclude_n, mix, seed=exclude_seed)} if exclude_n else set()
    pool = n
    while pool <= 20 * n:
        out, taken = [], set(excluded)
        for p in prompt_mix(pool, mix, seed=seed):
            if p.text not in taken:
                taken.add(p.text)
                out.append(p)
        if len(out) >= n:
            return out[:n]
        pool += max(n // 4, 8)          # the mix depends on its size: draw a larger one
    raise SystemExit(f"the {mix} mix of seed {seed} has fewer than {n} new prompts")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="embedded alias, folder or HF id")
    ap.add_argument("--mix", default="mixed", choices=MIXES)
    ap.add_argument("--seed", type=int, required=True, help="the new prompt mix's seed")
    ap.add_argument("--prompts", type=int, default=384)
    ap.add_argument("--exclude-seed", type=int, default=0, help="the seed of the corpus this one extends")
    ap.add_argument("--exclude-prompts", type=int, default=0, help="its prompt count (0: exclude nothing)")
    ap.add_argument("--tokens", type=int, default=96, help="greedy tokens per prompt")
    ap.add_argument("--batch", type=int, default=32, help="prompts per batched generate()")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="the corpus file (.jsonl)")
    args = ap.parse_args(argv)
    if not args.out.endswith(".jsonl"):
        print("error: --out must be a .jsonl file (train-drafter reads it as a distilled corpus)", file=sys.stderr)
        return 2
    if args.seed == args.exclude_seed and args.exclude_prompts:
        print("error: --seed must differ from --exclude-seed", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    specs = fresh_prompts(args.prompts, args.mix, args.seed, args.exclude_seed, args.exclude_prompts)
    model, path = load_model(args.target, "cpu", "float32")
    if unavailable_reason(model) is None:
        pack_linears(model)
    tok = load_tokenizer(path)
    meta = {"target": args.target, "mix": args.mix, "seed": args.seed,
            "excludes": {"seed": args.exclude_seed, "prompts": args.exclude_prompts}}
    t0 = time.monotonic()
    done = [0]

    def progress(k: int) -> None:
        done[0] += k
        print(f"{done[0]}/{len(specs)} prompts, {time.monotonic() - t0:.0f} s", flush=True)

    docs = distill(model, tok, specs, args.tokens, args.out, meta, batch=args.batch, progress=progress)
    print(f"{args.out}: {len(docs)} documents, {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
