"""One vLLM run, in the vLLM venv's python: `python vllm_worker.py REQUEST.json RESULT.json`.

Run as a script by cure_cli/bench/vllm_engine.py, never imported by cure: the venv has vLLM's own
transformers, so this file imports neither cure_core nor cure_cli, only vLLM and the standard library.

REQUEST: {"target", "draft" (a DFlash folder, or null for plain autoregressive decoding),
          "num_speculative_tokens", "dtype", "max_model_len", "prompts" [[ids]], "max_new_tokens",
          "stop_ids", "warmup", "warmup_tokens", "contexts" [[ids]] (proposals to record, dflash only),
          "threads" (null: vLLM's default binding)}
RESULT:  {"vllm_version", "load_s", "prompts": [{"token_ids", "first_token_s", "decode_s", "drafts",
          "draft_tokens", "accepted", "accepted_per_pos"}], "proposals": [{"context", "anchor", "draft"}]}
Progress goes to stderr as lines starting with PROGRESS (the parent shows them); vLLM's own log lines
are the parent's to keep or drop.
"""
from __future__ import annotations

import json
import os
import sys
import time

PROGRESS = "cure-vllm:"
_RECORDED: list = []                         # (anchor ids, draft ids) per propose() call, dflash runs


def say(msg: str) -> None:
    print(f"{PROGRESS} {msg}", file=sys.stderr, flush=True)


def _record_proposals(worker) -> str:
    """Runs inside the (in-process) worker: wrap the drafter's propose() to record what it drafts."""
    drafter = worker.model_runner.drafter
    original = drafter.propose

    def propose(*args, **kwargs):
        out = original(*args, **kwargs)
        anchors = kwargs.get("next_token_ids", args[4] if len(args) > 4 else None)
        _RECORDED.append(([int(t) for t in anchors.tolist()], out.tolist()))
        return out
    drafter.propose = propose
    return type(drafter).__name__


def _take_proposals(worker) -> list:
    out = list(_RECORDED)
    _RECORDED.clear()
    return out


def _counters(llm) -> dict:
    """vLLM's speculative-decoding counters (cumulative): drafts, draft tokens, accepted, per position."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        if m.name == "vllm:spec_decode_num_drafts":
            out["drafts"] = int(m.value)
        elif m.name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] = int(m.value)
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["accepted_per_pos"] = [int(v) for v in m.values]
    return out


def _delta(after: dict, before: dict) -> dict:
    per = [a - (before["accepted_per_pos"][i] if i < len(before["accepted_per_pos"]) else 0)
           for i, a in enumerate(after["accepted_per_pos"])]
    return {"drafts": after["drafts"] - before["drafts"], "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
            "accepted": after["accepted"] - before["accepted"], "accepted_per_pos": per}


def kv_cache_bytes(target: str, max_model_len: int, dtype: str) -> int:
    """KV bytes for one request of max_model_len tokens, target and a draft of the same width, doubled, plus
    64 MiB: sized to the job, not to vLLM's default (a fixed share of the machine's memory, which fails on a
    machine whose memory is busy with other work)."""
    cfg = json.loads(open(os.path.join(target, "config.json"), encoding="utf-8").read())
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    width = 4 if dtype in ("float32", "fp32") else 2
    per_token = 2 * (cfg["num_hidden_layers"] + 4) * heads * head_dim * width
    return 2 * per_token * max_model_len + (64 << 20)


def main(request_path: str, result_path: str) -> int:
    req = json.loads(open(request_path, encoding="utf-8").read())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")      # the engine in this process: hooks see it
    if req.get("threads"):
        os.environ["OMP_NUM_THREADS"] = str(req["threads"])
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{int(req['threads']) - 1}")
    t0 = time.perf_counter()
    import vllm
    from vllm import LLM, SamplingParams

    kind = "dflash" if req.get("draft") else "ar"
    spec = None
    if req.get("draft"):
        spec = {"method": "dflash", "model": req["draft"], "num_speculative_tokens": int(req["num_speculative_tokens"])}
    say(f"{kind}: loading {req['target']}" + (f" with the drafter {req['draft']}" if spec else ""))
    llm = LLM(model=req["target"], speculative_config=spec, dtype=req.get("dtype", "float32"),
              max_model_len=int(req["max_model_len"]), enforce_eager=True, seed=int(req.get("seed", 0)),
              disable_log_stats=False, skip_tokenizer_init=False,
              generation_config="vllm",                # the request's sampling only, not the model's defaults
              kv_cache_memory_bytes=kv_cache_bytes(req["target"], int(req["max_model_len"]), req.get("dtype", "float32")))
    load_s = time.perf_counter() - t0
    stop = [int(t) for t in req.get("stop_ids") or []]

    def params(n: int):
        return SamplingParams(temperature=0.0, max_tokens=n, stop_token_ids=stop, ignore_eos=not stop,
                              detokenize=False)

    def one(ids, n: int):
        return llm.generate([{"prompt_token_ids": list(ids)}], params(n), use_tqdm=False)[0]

    result = {"vllm_version": vllm.__version__, "kind": kind, "load_s": load_s, "prompts": [], "proposals": []}
    contexts = req.get("contexts") or []
    if contexts and spec:
        llm.collective_rpc(_record_proposals)
        for ctx in contexts:                       # one step: prefill, the first token, the first proposal
            one(ctx, 1)
            recorded = llm.collective_rpc(_take_proposals)[0]
            if not recorded:
                raise RuntimeError("vLLM made no proposal after the prefill")
            anchors, drafts = recorded[0]
            result["proposals"].append({"context": list(ctx), "anchor": anchors[0], "draft": drafts[0]})
        say(f"{kind}: recorded proposals on {len(contexts)} context(s)")

    prompts = req.get("prompts") or []
    for i in range(int(req.get("warmup", 0))):
        if prompts:
            one(prompts[i % len(prompts)], int(req.get("warmup_tokens", 32)))
    for i, ids in enumerate(prompts):
        before = _counters(llm)
        out = one(ids, int(req["max_new_tokens"]))
        after = _counters(llm)
        m = out.metrics
        tokens = [int(t) for t in out.outputs[0].token_ids]
        decode_s = max(0.0, m.last_token_ts - m.first_token_ts) if m is not None else None
        row = {"token_ids": tokens, "first_token_s": getattr(m, "first_token_latency", None), "decode_s": decode_s,
               **_delta(after, before)}
        result["prompts"].append(row)
        rate = (len(tokens) - 1) / decode_s if decode_s else 0.0
        say(f"{kind}: prompt {i + 1}/{len(prompts)}: {len(tokens)} tokens, {rate:.1f} tok/s")
    tmp = result_path + ".part"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: vllm_worker.py REQUEST.json RESULT.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
