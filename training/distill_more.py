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

`--exclude-corpus FILE.jsonl` (repeatable) excludes the prompts of an existing corpus file instead: they
are rebuilt from its header (seed, count, and what IT excluded, recursively) and must match the header's
prompts sha, so a corpus that extends several others repeats none of their prompts:

    python training/distill_more.py --target qwen-coder-1.5b --mix mixed --seed 2 --prompts 384 \\
        --exclude-corpus training/qwen-coder-1.5b-pard-full/corpus/self-distill.jsonl \\
        --exclude-corpus training/qwen-coder-1.5b-pard-full/corpus/self-distill-seed1.jsonl \\
        --tokens 96 --batch 32 --out training/qwen-coder-1.5b-pard-full/corpus/self-distill-seed2.jsonl
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from cure_core.cpu_kernels import pack_linears, unavailable_reason
from cure_core.models import load_model, load_tokenizer
from cure_core.training.distill import distill, prompts_sha, read_corpus
from cure_core.training.prompt_mix import MIXES, prompt_mix


def fresh_prompts(n: int, mix: str, seed: int, exclude_seed: int = 0, exclude_n: int = 0,
                  excluded: set | None = None) -> list:
    """The first n prompts of the mix of `seed` (in its order) that neither the mix of `exclude_seed` (its
    first exclude_n) nor the texts `excluded` hold, each once."""
    excluded = set(excluded or ())
    if exclude_n:
        excluded |= {p.text for p in prompt_mix(exclude_n, mix, seed=exclude_seed)}
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


def meta_prompts(meta: dict) -> list:
    """The prompts a corpus header describes, rebuilt: the plain mix of its seed, or (a corpus this script
    wrote) its seed's fresh prompts minus what it excluded, a legacy {seed, prompts} or a list of headers."""
    mix, seed, n = meta["mix"], meta["seed"], meta["prompts"]
    ex = meta.get("excludes")
    if ex is None:
        specs = prompt_mix(n, mix, seed=seed)
    elif isinstance(ex, dict):
        specs = fresh_prompts(n, mix, seed, ex["seed"], ex["prompts"])
    else:
        specs = fresh_prompts(n, mix, seed, excluded={p.text for m in ex for p in meta_prompts(m)})
    if prompts_sha(specs) != meta["prompts_sha"]:
        raise ValueError(f"cannot rebuild the prompts of the {mix} mix, seed {seed} (sha differs)")
    return specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="embedded alias, folder or HF id")
    ap.add_argument("--mix", default="mixed", choices=MIXES)
    ap.add_argument("--seed", type=int, required=True, help="the new prompt mix's seed")
    ap.add_argument("--prompts", type=int, default=384)
    ap.add_argument("--exclude-seed", type=int, default=0, help="the seed of the corpus this one extends")
    ap.add_argument("--exclude-prompts", type=int, default=0, help="its prompt count (0: exclude nothing)")
    ap.add_argument("--exclude-corpus", action="append", default=[], metavar="FILE.jsonl",
                    help="a corpus file whose prompts to exclude (repeatable; rebuilt from its header)")
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
    if args.exclude_corpus and args.exclude_prompts:
        print("error: give --exclude-corpus or --exclude-seed/--exclude-prompts, not both", file=sys.stderr)
        return 2
    metas, excluded = [], set()
    for f in args.exclude_corpus:
        try:
            meta = read_corpus(f)[0]
            # any mix may be excluded (its prompts are rebuilt from ITS mix); only the very mix being drawn not
            if meta is None or meta.get("mix") not in MIXES or (meta["mix"], meta.get("seed")) == (args.mix, args.seed):
                raise ValueError(f"its header is not a corpus of another mix or seed than {args.mix}, seed {args.seed}")
            excluded |= {p.text for p in meta_prompts(meta)}
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --exclude-corpus {f}: {e}", file=sys.stderr)
            return 2
        metas.append(meta)
    torch.set_num_threads(args.threads)
    specs = fresh_prompts(args.prompts, args.mix, args.seed, args.exclude_seed, args.exclude_prompts, excluded)
    model, path = load_model(args.target, "cpu", "float32")
    if unavailable_reason(model) is None:
        pack_linears(model)
    tok = load_tokenizer(path)
    excludes = metas or {"seed": args.exclude_seed, "prompts": args.exclude_prompts}
    meta = {"target": args.target, "mix": args.mix, "seed": args.seed, "excludes": excludes}
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
