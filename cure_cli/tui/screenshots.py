"""Write the README screenshots assets/chat.svg and assets/inspect.svg from a Pilot run.

    python -m cure_cli.tui.screenshots                         # replay tests/data/sample_trace.jsonl (tiny models)
    python -m cure_cli.tui.screenshots --trace T.jsonl [--tokenizer FOLDER]
    python -m cure_cli.tui.screenshots --demo-model qwen-coder-0.5b [--noise 0.15]

--demo-model records a real trace first: the target decodes with CURE against a drafter that is the
same model with Gaussian weight noise (an AR chain drafter that disagrees now and then, so the
trees show rejections and repair wins), then both apps replay it. Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "tests" / "data" / "sample_trace.jsonl"


def record_demo(model: str, noise: float, out: Path, prompt: str, max_new: int) -> Path:
    from cure_core.config import DecodeConfig
    from cure_core.engine import Engine
    from cure_core.models import build_pair, encode_prompt, load_pair
    from cure_core.tiny import perturbed_copy
    from cure_core.trace import TraceWriter

    loaded = load_pair(model)
    tok = loaded.tokenizer
    pair, _ = build_pair(loaded.pair.target, perturbed_copy(loaded.pair.target, noise=noise, seed=1), drafter="ar",
                         vocab_size=len(tok), eos_ids=loaded.pair.eos_ids,
                         names={"target": model, "draft": f"{model} + {noise:g} weight noise (demo drafter)"})
    cfg = DecodeConfig.of(strategy="cure", k=8, max_new_tokens=max_new)
    ids = encode_prompt(tok, prompt, True)
    ar = cfg.with_(strategy="ar", max_new_tokens=16)     # a short AR run: the speedup baseline
    with TraceWriter(out, models=pair.names, config=cfg.to_dict()) as writer:
        for c in (cfg, ar):
            writer.begin(ids, prompt, c.strategy, c.to_dict())
            for block in Engine(pair).generate(ids, c):
                writer.block(block)
            writer.end()
    return out


async def shoot(trace_path: Path, tokenizer, out_dir: Path, size: tuple[int, int]) -> None:
    from textual.widgets import Input

    from cure_core.config import DecodeConfig
    from cure_core.trace import read_trace

    from .app_chat import ChatApp
    from .app_inspect import InspectApp
    from .engine_protocol import ReplayEngine

    trace = read_trace(trace_path)
    gen = trace.generations[0]
    wins = [i for i, b in enumerate(gen.blocks) if b.repair_won]
    engine = ReplayEngine(trace, tokenizer)
    chat = ChatApp(engine, engine.check(DecodeConfig()), cursor_blink=False)   # AR baseline: an ar run in the trace
    async with chat.run_test(size=size) as pilot:
        await chat.workers.wait_for_complete()
        pilot.app.query_one("#prompt", Input).value = gen.prompt or "Hello"
        await pilot.press("enter")
        while chat.generating:
            await pilot.pause(0.02)
        await pilot.pause()
        if wins:
            chat.action_select_block(wins[-1])
        chat.action_toggle_origins()                      # the answer coloured by origin, the block reversed
        await pilot.pause()
        chat.save_screenshot("chat.svg", str(out_dir))
    inspect = InspectApp(trace, tokenizer, source=str(trace_path), start=wins[0] if wins else 0)
    async with inspect.run_test(size=size) as pilot:
        await pilot.pause()
        inspect.save_screenshot("inspect.svg", str(out_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder / HF id (default: the trace's target)")
    ap.add_argument("--demo-model", default=None)
    ap.add_argument("--noise", type=float, default=0.15)
    ap.add_argument("--prompt", default="Write a Python function is_prime(n).")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", type=Path, default=ROOT / "assets")
    ap.add_argument("--size", default="110x32", help="terminal WIDTHxHEIGHT")
    args = ap.parse_args()
    from ..common import quiet_transformers
    from .engine_protocol import load_trace_tokenizer
    quiet_transformers()
    width, height = (int(x) for x in args.size.lower().split("x"))
    if args.demo_model:
        trace_path = record_demo(args.demo_model, args.noise, Path(tempfile.mkdtemp()) / "demo.jsonl", args.prompt,
                                 args.max_new_tokens)
    else:
        trace_path = args.trace or SAMPLE
    if args.tokenizer is None and trace_path == SAMPLE:
        from cure_core.tiny import byte_tokenizer
        tokenizer = byte_tokenizer()
    else:
        from cure_core.trace import read_trace
        tokenizer = load_trace_tokenizer(read_trace(trace_path).header.get("models") or {}, args.tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(shoot(trace_path, tokenizer, args.out, (width, height)))
    print(f"wrote {args.out / 'chat.svg'} and {args.out / 'inspect.svg'} from {trace_path}")


if __name__ == "__main__":
    main()
