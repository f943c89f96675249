"""End to end with vLLM (CPU build, its own venv): a drafter trained by `cure train-drafter`, exported by
`cure export-vllm`, loaded by vLLM's dflash method.

- vLLM's greedy output with our drafter == HF greedy == `cure generate`, prompt by prompt;
- vLLM's first proposal after each fixed context == our drafter's propose() on the same context.

Needs the vLLM venv (.ci/vllm builds it; cure_cli/bench/vllm_env.py says where): skipped without it.
The tiny target has head_dim 32: vLLM's CPU attention needs head_dim >= 32.
"""
import json

import pytest
import torch
from typer.testing import CliRunner

from cure_cli.bench import vllm_env
from cure_cli.main import app

_problem = vllm_env.venv_problem(probe=False)
pytestmark = pytest.mark.skipif(_problem is not None, reason=f"vLLM interop needs its venv: {_problem}")

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "The quick brown fox", "class Stack:\n    def",
           "for i in range(10):"]
CONTEXTS = ["def add(a, b):", "hello world", "x = [1, 2, 3]\n", "# sort a list\n", "while True:",
            "SELECT * FROM", "print('hi')", "a = b + c", "import numpy as np\n", "return x"]
NEW_TOKENS = 24
BLOCK = 8


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny target (head_dim 32) and a DFlash drafter trained for it by `cure train-drafter` (self-distilled,
    with a draft vocabulary as the shipped drafter has), exported by `cure export-vllm`."""
    from cure_core.tiny import byte_tokenizer, tiny_target
    root = tmp_path_factory.mktemp("vllm_interop")
    target = tiny_target(seed=0, hidden=128, heads=4, kv_heads=2, layers=4)
    assert target.config.head_dim >= 32
    tok = byte_tokenizer()
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    r = CliRunner().invoke(app, [
        "train-drafter", "--target", str(root / "target"), "--kind", "dflash", "--out", str(root / "draft"),
        "--corpus", "self-distill", "--distill-prompts", "16", "--distill-tokens", "64", "--steps", "300",
        "--block-size", str(BLOCK), "--lr", "3e-3", "--batch", "2", "--anchors", "8", "--seq-len", "64",
        "--max-tokens", "3000", "--threads", "1", "--eval-prompts", "0", "--draft-vocab", "256"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["export-vllm", str(root / "draft"), str(root / "vllm-draft"), "--target", str(root / "target"),
                                  "--json"])
    assert r.exit_code == 0, r.output
    export = json.loads(r.stdout)
    assert export["speculative_config"]["num_speculative_tokens"] == BLOCK - 1
    assert export["head_from"] == str(root / "target")          # its own head over the draft vocabulary
    return root, target, tok


def _hf_greedy(target, ids, n, eos):
    out = target.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=list(eos),
                          pad_token_id=eos[0], attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def _cure_generate(root, text):
    r = CliRunner().invoke(app, ["generate", text, "--target", str(root / "target"), "--draft", str(root / "draft"),
                                 "--raw", "-n", str(NEW_TOKENS), "--k", str(BLOCK), "--strategy", "cure", "--json",
                                 "--dtype", "float32"])       # HF and vLLM run float32 here (auto may be int8 or bfloat16)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["token_ids"]


def _our_proposals(root, target, contexts):
    """Our drafter on each context: features of the context from the target, anchor = its greedy next token."""
    from cure_core.drafters.dflash import load_dflash
    from cure_core.tiny import BYTE_VOCAB
    drafter = load_dflash(root / "draft", target, vocab_size=BYTE_VOCAB)
    fixed = set(drafter.vocab.fixed)
    out = []
    with torch.no_grad():
        for ids in contexts:
            res = target(torch.tensor([ids]), output_hidden_states=True)
            hidden = torch.cat([res.hidden_states[i][0] for i in drafter.target_layers], dim=-1)
            anchor = int(res.logits[0, -1].argmax())
            # Ours also drafts the context's ids; vLLM's head is fixed. Inside the fixed list they agree exactly.
            assert set(ids) | {anchor} <= fixed, "a fixed context falls outside the draft vocabulary"
            drafter.reset(ids, hidden)
            out.append((anchor, drafter.propose(anchor, BLOCK - 1, 1).tokens))
    return out


def test_vllm_dflash_with_our_drafter_equals_hf_greedy_and_cure_generate(saved, tmp_path):
    from cure_cli.bench.vllm_engine import VllmRequest, compare_proposals, run_vllm
    from cure_core.models import eos_ids
    root, target, tok = saved
    eos = eos_ids(target, tok)
    prompts = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    contexts = [tok.encode(c, add_special_tokens=False) for c in CONTEXTS]
    hf = [_hf_greedy(target, ids, NEW_TOKENS, eos) for ids in prompts]
    cure = [_cure_generate(root, p) for p in PROMPTS]
    lines = []
    vllm = run_vllm(VllmRequest(str(root / "target"), str(root / "vllm-draft"), "float32"), k=BLOCK, prompts=prompts,
                    max_new_tokens=NEW_TOKENS, stop_ids=eos, warmup=0, warmup_tokens=8, threads=None,
                    work_dir=tmp_path, contexts=contexts, on_progress=lines.append)
    assert any("dflash: prompt 5/5" in x for x in lines)
    ar_out = [r["token_ids"] for r in vllm["vllm-ar"]["prompts"]]
    dflash_out = [r["token_ids"] for r in vllm["vllm-dflash"]["prompts"]]
    for i, p in enumerate(PROMPTS):
        assert len(hf[i]) == NEW_TOKENS or hf[i][-1] in eos
        assert cure[i] == hf[i], f"cure generate differs from HF greedy on {p!r}"
        assert ar_out[i] == hf[i], f"vLLM (no drafter) differs from HF greedy on {p!r}"
        assert dflash_out[i] == hf[i], f"vLLM dflash with our drafter differs from HF greedy on {p!r}"
    equal, diffs = compare_proposals(vllm["vllm-dflash"]["proposals"], _our_proposals(root, target, contexts))
    assert len(vllm["vllm-dflash"]["proposals"]) == len(CONTEXTS)
    assert not diffs, f"vLLM's proposals differ from our drafter's: {diffs[:2]}"
    drafts = sum(r["drafts"] for r in vllm["vllm-dflash"]["prompts"])
    accepted = sum(r["accepted"] for r in vllm["vllm-dflash"]["prompts"])
    assert drafts > 0 and accepted > 0      # the drafter ran in vLLM's loop, and vLLM accepted some of its drafts
    print(f"\nvLLM {vllm['vllm-dflash']['vllm_version']} dflash output == HF greedy == cure generate on "
          f"{len(PROMPTS)}/{len(PROMPTS)} prompts ({NEW_TOKENS} tokens each; vLLM ar too); proposals equal on "
          f"{equal}/{len(CONTEXTS)} fixed contexts (K={BLOCK}); vLLM tau {1 + accepted / drafts:.2f} "
          f"({accepted} of {drafts * (BLOCK - 1)} drafted tokens accepted)")
