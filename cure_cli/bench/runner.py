"""The benchmark loop: every run (strategy config) on the same prompts, interleaved prompt by prompt.

    for each prompt:            # so machine drift (thermal, other load) hits every run alike
        for each run:           # ar, sd, parallel, cure, ddtree, then any CURE ablations, in a
            generate, record,   # balanced order (balanced_order: each run in each position and
            score               # after each other run alike over the prompts), or --order fixed

Models are loaded once by the caller; one Engine serves every run (each run's config keeps its own
budget tuner across prompts). Finished
(prompt, run) pairs are appended to `progress.jsonl` in the output directory (one JSON line
each, flushed and fsynced), which is what `--resume` reads back.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from cure_core import records
from cure_core.block import Block
from cure_core.config import DecodeConfig
from cure_core.errors import CureError
from cure_core.metrics import run_order
from cure_core.options import parse_list  # noqa: F401 - the --strategies / --ablate lists

PROGRESS_FILE = "progress.jsonl"

# --ablate NAME -> the DecodeConfig change it makes to full CURE (paper Table 4)
ABLATIONS = {"branch0": {"keep_branch0": False}, "resync": {"resync": False}}


class BenchError(CureError):
    """Bad bench input: unknown strategy/ablation, an output dir that cannot be resumed..."""


@dataclass(frozen=True)
class RunSpec:
    name: str                      # "ar", "cure", "cure-no-resync", ...
    config: DecodeConfig

    @property
    def strategy(self) -> str:
        return self.config.strategy

    @property
    def ablation(self) -> bool:
        return self.name != self.strategy


def build_runs(base: DecodeConfig, strategies: Sequence[str], ablate: Sequence[str] = ()) -> list[RunSpec]:
    """One RunSpec per strategy, then CURE with each ablation (and all of them together when more
    than one is asked for). The caller makes sure 'cure' is among the strategies when ablating.
    Rule: the ablations are the paper's (Table 4), so they ablate the paper's tree."""
    from cure_core.config import STRATEGIES
    for s in strategies:
        if s not in STRATEGIES:
            raise BenchError(f"unknown strategy {s!r} in --strategies; choose from {', '.join(STRATEGIES)}")
    for a in ablate:
        if a not in ABLATIONS:
            raise BenchError(f"unknown ablation {a!r} in --ablate; choose from {', '.join(ABLATIONS)}")
    runs = [RunSpec(s, base.with_(strategy=s)) for s in strategies]
    combos = [[a] for a in ablate] + ([list(ablate)] if len(ablate) > 1 else [])
    for combo in combos:
        changes: dict = {}
        for a in combo:
            changes.update(ABLATIONS[a])
        runs.append(RunSpec("cure-no-" + "-no-".join(combo), base.with_(strategy="cure", cure_tree="paper", **changes)))
    return runs


@dataclass(frozen=True)
class BenchPrompt:
    index: int                     # position in the data set (after --limit)
    problem: object                # cure_tasks.Problem
    ids: tuple[int, ...]           # encoded prompt (chat template or raw)

    @property
    def task_id(self) -> str:
        return self.problem.task_id


@dataclass
class PairResult:
    """One finished generation: one prompt under one run."""
    prompt_index: int
    task_id: str
    run: str
    strategy: str
    prompt_ids: list[int]
    token_ids: list[int]
    completion: str
    blocks: list[Block] = field(default_factory=list)
    score: dict | None = None      # scoring.score_problem's verdict, None when not scored

    @property
    def key(self) -> tuple[int, str]:
        return (self.prompt_index, self.run)

    def to_json(self) -> dict:
        return {"type": "pair", "prompt_index": self.prompt_index, "task_id": self.task_id, "run": self.run,
                "strategy": self.strategy, "prompt_ids": list(self.prompt_ids), "token_ids": list(self.token_ids),
                "completion": self.completion, "score": self.score, "blocks": [b.to_dict() for b in self.blocks]}

    @staticmethod
    def from_json(d: dict) -> "PairResult":
        """A pair read back from progress.jsonl, every field checked by type and range (RecordError)."""
        get = lambda key: records.field(d, key, "pair")  # noqa: E731
        score = d.get("score")
        if score is not None:
            score = records.mapping(score, "score")
            records.text(records.field(score, "metric", "score"), "score metric")
            if type(records.field(score, "passed", "score")) is not bool:
                raise records.RecordError("score passed must be true or false")
        return PairResult(prompt_index=records.integer(get("prompt_index"), "prompt_index"),
                          task_id=records.text(get("task_id"), "task_id"), run=records.text(get("run"), "run"),
                          strategy=records.text(get("strategy"), "strategy"),
                          prompt_ids=list(records.token_ids(get("prompt_ids"), "prompt_ids")),
                          token_ids=list(records.token_ids(get("token_ids"), "token_ids")),
                          completion=records.text(get("completion"), "completion"),
                          blocks=[records.block_from_record(b) for b in records.listing(get("blocks"), "blocks")],
                          score=score)


def interleave(prompts: Sequence[BenchPrompt], runs: Sequence[RunSpec], done: Iterable[tuple[int, str]] = (),
               order: str = "balanced") -> Iterator[tuple[BenchPrompt, RunSpec]]:
    """The benchmark order: prompt-major, every run in turn for each prompt, in a balanced order
    (`balanced_order`, by the prompt's index, so a resumed run keeps it) or the listed one ("fixed", as
    runs before `--order` did); finished pairs skipped."""
    skip = set(done)
    for p in prompts:
        for j in run_order(len(runs), p.index, order):
            r = runs[j]
            if (p.index, r.name) not in skip:
                yield p, r


def generate_pair(engine, prompt: BenchPrompt, run: RunSpec, decode: Callable[[list[int]], str]) -> PairResult:
    blocks = list(engine.generate(list(prompt.ids), run.config))
    tokens = [t for b in blocks for t in b.emitted]
    return PairResult(prompt_index=prompt.index, task_id=prompt.task_id, run=run.name, strategy=run.strategy,
                      prompt_ids=list(prompt.ids), token_ids=tokens, completion=decode(tokens), blocks=blocks)


def warm_up(engine, runs: Sequence[RunSpec], prompts: Sequence[BenchPrompt], n: int, max_new_tokens: int) -> None:
    """n throw-away generations of at most `max_new_tokens` per run (cycling through the prompts): the same
    code paths, shorter; nothing recorded."""
    if not prompts:
        return
    for i in range(n):
        p = prompts[i % len(prompts)]
        for r in runs:
            cfg = r.config.with_(max_new_tokens=min(r.config.max_new_tokens, max_new_tokens))
            for _ in engine.generate(list(p.ids), cfg):
                pass


def run_interleaved(engine, runs: Sequence[RunSpec], prompts: Sequence[BenchPrompt],
                    done: Iterable[tuple[int, str]], decode: Callable[[list[int]], str],
                    score: Callable[[object, str], dict | None] | None = None,
                    on_start: Callable[[BenchPrompt, RunSpec], None] | None = None,
                    on_pair: Callable[[PairResult], None] | None = None,
                    order: str = "balanced") -> list[PairResult]:
    """Run every unfinished (prompt, run) pair in benchmark order. KeyboardInterrupt propagates
    (the pairs already handed to on_pair are kept by the caller)."""
    out = []
    for p, r in interleave(prompts, runs, done, order):
        if on_start:
            on_start(p, r)
        pair = generate_pair(engine, p, r, decode)
        if score is not None:
            pair.score = score(p.problem, pair.completion)
        out.append(pair)
        if on_pair:
            on_pair(pair)
    return out


# ---------------------------------------------------------------- progress file (--resume)

def _comparable(fp: dict) -> dict:
    return {k: v for k, v in fp.items() if k != "runs"}


class ProgressLog:
    """`progress.jsonl`: a header with the run's fingerprint, then one line per finished pair.

    resume=False: the directory must not hold a progress file yet. resume=True: it must, its
    fingerprint must match (same models, data set, device, dtype, prompt encoding, and the same
    config for every run present in both), and its finished pairs are loaded. A torn last line
    (a hard kill mid-write) is ignored.
    """

    def __init__(self, out_dir: Path, fingerprint: dict, resume: bool):
        self.path = Path(out_dir) / PROGRESS_FILE
        self.pairs: list[PairResult] = []
        if resume:
            if not self.path.exists():
                raise BenchError(f"nothing to resume in {out_dir}: it has no {PROGRESS_FILE}")
            self._load(fingerprint)
            self._f = open(self.path, "a", encoding="utf-8")
        else:
            if self.path.exists():
                raise BenchError(f"{out_dir} already holds a benchmark run: pass --resume to continue it, "
                                 f"or choose another --output-dir")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "w", encoding="utf-8")
            self._write({"type": "header", "fingerprint": fingerprint})

    def _load(self, fingerprint: dict) -> None:
        """Check the header against ``fingerprint`` and load the finished pairs.

        Rule: every line is checked by type and range (records.py); a bad line is one BenchError, except a
        bad *last* line, which is a torn write: it is dropped (atomically) and that pair simply reruns.
        """
        header, torn = None, False
        try:
            for no, obj in records.json_lines(self.path, "progress"):
                if header is None:
                    header = self._check_header(obj, fingerprint)
                elif obj.get("type") == "pair":
                    try:
                        self.pairs.append(PairResult.from_json(obj))
                    except records.RecordError as e:
                        raise records.RecordError(f"{self.path}:{no}: corrupt progress line ({e})", no) from None
        except records.RecordError as e:
            if not (e.last and header is not None):
                raise BenchError(f"{e}: cannot resume") from None
            torn = True
        if header is None:
            raise BenchError(f"{self.path} is empty: cannot resume")
        if torn:
            self._drop_torn_tail()

    def _check_header(self, obj: dict, fingerprint: dict) -> dict:
        if obj.get("type") != "header":
            raise BenchError(f"{self.path}: corrupt header line: cannot resume")
        try:
            old = records.mapping(obj.get("fingerprint"), "fingerprint", optional=True)
            old_runs = records.mapping(old.get("runs"), "fingerprint runs", optional=True)
        except records.RecordError as e:
            raise BenchError(f"{self.path}: corrupt header line ({e}): cannot resume") from None
        if _comparable(old) != _comparable(fingerprint):
            diff = sorted(k for k in set(_comparable(old)) | set(_comparable(fingerprint))
                          if old.get(k) != fingerprint.get(k))
            raise BenchError(f"cannot resume {self.path.parent}: it was run with different settings "
                             f"({', '.join(diff)}); use the same flags or a new --output-dir")
        new_runs = fingerprint.get("runs") or {}
        changed = [n for n in new_runs if n in old_runs and old_runs[n] != new_runs[n]]
        if changed:
            raise BenchError(f"cannot resume {self.path.parent}: run(s) {', '.join(changed)} had a different "
                             f"decoding config; use the same engine flags or a new --output-dir")
        return obj

    def _drop_torn_tail(self) -> None:
        """Cut the file after its last complete line (atomically), so appends start on a fresh line."""
        data = self.path.read_bytes()
        body = data[:-1] if data.endswith(b"\n") else data
        tmp = self.path.with_name(f".{self.path.name}.part")
        tmp.write_bytes(data[: body.rfind(b"\n") + 1])
        os.replace(tmp, self.path)

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def append(self, pair: PairResult) -> None:
        self.pairs.append(pair)
        self._write(pair.to_json())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
