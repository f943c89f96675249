"""`cure train-drafter`: DFlash and PARD drafters trained on a tiny target, checkpoints, --resume,
loading through --drafter auto, and lossless decoding with the trained drafters."""
import json
import random

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core.config import DecodeConfig
from cure_core.engine import generate_ids
from cure_core.models import load_pair
from cure_core.tiny import byte_tokenizer, tiny_target
from cure_core.training import corpus as C
from cure_core.training.evaluate import _offset_predictions
from cure_core.training.features import target_forward
from cure_core.training.prepare import DataSpec
from cure_core.training.run import RunOptions, run
from cure_core.training.trainer import TrainSpec


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tiny_target(seed=0).save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    r = random.Random(0)
    (root / "corpus").mkdir()
    for i in range(8):
        body = "".join(f"    {v} = {v} + {r.randint(0, 9)}\n" for v in (r.choice(["x", "y", "total"]) for _ in range(30)))
        (root / "corpus" / f"f{i}.py").write_text(f"def f{i}(x, y):\n{body}    return x\n")
    return root


def _opts(setup, out, kind, steps=30, **kw):
    spec = dict(kind=kind, steps=steps, block_size=6, lr=3e-3, batch=2, anchors=8, checkpoint_every=10)
    spec.update(kw)
    return RunOptions(target=str(setup / "target"), out=out, train=TrainSpec(**spec),
                      data=DataSpec(corpus=[str(setup / "corpus")], seq_len=64, max_tokens=3000, heldout_frac=0.25),
                      eval_prompts=0, eval_set="heldout")


def _bars(name, total, initial=0):
    return lambda n=1, loss=None, acc=None: None


def _mean(xs):
    return sum(xs) / len(xs)


def _check_lossless(out, setup):
    loaded = load_pair(str(setup / "target"), str(out), drafter="auto")
    tok = loaded.tokenizer
    for text in ("def g(x, y):\n    total = ", "    y = y + 3\n"):
        ids = tok.encode(text, add_special_tokens=False)
        ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=24, k=8), ids)
        for strat in ("parallel", "cure"):
            assert generate_ids(loaded.pair, DecodeConfig.of(strategy=strat, max_new_tokens=24, k=8), ids) == ref
    return loaded


def test_dflash_cli_trains_saves_loads_and_decodes_losslessly(setup, tmp_path):
    out = tmp_path / "dflash"
    res = CliRunner().invoke(app, [
        "train-drafter", "--target", str(setup / "target"), "--kind", "dflash", "--out", str(out),
        "--corpus", str(setup / "corpus"), "--steps", "30", "--block-size", "6", "--lr", "3e-3", "--batch", "2",
        "--anchors", "8", "--seq-len", "64", "--max-tokens", "3000", "--threads", "1", "--eval-prompts", "2",
        "--eval-set", "heldout", "--eval-new-tokens", "16", "--checkpoint-every", "10", "--draft-vocab", "40"])
    assert res.exit_code == 0, res.output
    assert "tau K=8 (parallel)" in res.output and "offset 1" in res.output
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 6
    assert set(cfg["dflash_config"]) >= {"mask_token_id", "target_layer_ids"}
    state = load_file(str(out / "model.safetensors"))
    assert "fc.weight" in state and "layers.0.self_attn.q_norm.weight" in state
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in state)
    assert state["draft_vocab"].dtype == torch.int64 and state["draft_vocab"].shape == (40,)
    assert cfg["dflash_config"]["mask_token_id"] not in state["draft_vocab"].tolist()
    hist = json.loads((out / "train.json").read_text())["history"]
    assert _mean([h["loss"] for h in hist[-5:]]) < _mean([h["loss"] for h in hist[:5]])
    ev = json.loads((out / "eval.json").read_text())
    assert ev["lossless"] and set(ev["per_position_top1"]) == {"1", "2", "3", "4"} and ev["tau"]["parallel"] >= 1.0
    assert (out / "checkpoint" / "state.json").exists() and list((out / "features").glob("shard_*.safetensors"))
    loaded = _check_lossless(out, setup)
    assert loaded.drafter_kind == "dflash"
    assert loaded.pair.drafter.vocab.fixed == state["draft_vocab"].tolist()

    # The eval's batched block forward drafts exactly what the engine's drafter proposes.
    d = loaded.pair.drafter
    seq = loaded.tokenizer.encode("def h(x, y):\n    x = x + 1\n    return y\n", add_special_tokens=False)
    _, feats = target_forward(loaded.pair.target, seq, d.target_layer_ids)
    for a in (5, 17):
        d.reset(seq[:a], feats[:a])
        prop = d.propose(seq[a], 7, 8).tokens
        ok = _offset_predictions(loaded.pair, "dflash", seq[: a + 8], a, 8)
        assert all(ok[j][0] == (prop[j - 1] == seq[a + j]) for j in range(1, 8))


def test_pard_trains_loads_as_pard_and_decodes_losslessly(setup, tmp_path):
    out = tmp_path / "pard"
    res = run(_opts(setup, out, "pard", steps=30), _bars, log=lambda m: None)
    hist = json.loads((out / "train.json").read_text())["history"]
    assert _mean([h["loss"] for h in hist[-5:]]) < _mean([h["loss"] for h in hist[:5]])
    assert json.loads((out / "config.json").read_text())["pard_token"] == res["train"]["mask_token_id"]
    loaded = _check_lossless(out, setup)
    assert loaded.drafter_kind == "pard"
    # The shrunk copy keeps the target's embedding frozen (only its decoder layers learn); it was saved in fp16.
    emb = loaded.pair.drafter.lm.model.get_input_embeddings().weight
    assert torch.equal(emb, loaded.pair.target.get_input_embeddings().weight.half().to(emb.dtype))
    # The eval's mixed-mask forward drafts exactly what PardDrafter proposes.
    d = loaded.pair.drafter
    seq = loaded.tokenizer.encode("def h(x, y):\n    x = x + 1\n    return y\n", add_special_tokens=False)
    a = 12
    d.reset(seq[:a])
    prop = d.propose(seq[a], 6, 8).tokens
    ok = _offset_predictions(loaded.pair, "pard", seq[: a + 8], a, 8)
    assert all(ok[j][0] == (prop[j - 1] == seq[a + j]) for j in range(1, 7))


def test_resume_continues_exactly(setup, tmp_path):
    full = tmp_path / "full"
    run(_opts(setup, full, "dflash", steps=12, checkpoint_every=6), _bars, log=lambda m: None)
    part = tmp_path / "part"
    run(_opts(setup, part, "dflash", steps=6, checkpoint_every=6), _bars, log=lambda m: None)
    shard = next((part / "features").glob("shard_*.safetensors"))
    mtime = shard.stat().st_mtime_ns
    msgs = []
    opts = _opts(setup, part, "dflash", steps=12, checkpoint_every=6)
    opts.resume = True
    res = run(opts, _bars, log=msgs.append)
    assert any("resumed" in m and "step 6" in m for m in msgs)
    assert res["train"]["steps_done"] == 12
    assert shard.stat().st_mtime_ns == mtime                     # cached features reused
    a, b = load_file(str(full / "model.safetensors")), load_file(str(part / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k].float(), b[k].float(), atol=2e-3, rtol=1e-2)
    ha = json.loads((full / "train.json").read_text())["history"]
    hb = json.loads((part / "train.json").read_text())["history"]
    assert [round(h["loss"], 4) for h in ha] == [round(h["loss"], 4) for h in hb]


@pytest.mark.parametrize("flag,value", [("--steps", "0"), ("--batch", "0"), ("--anchors", "0"), ("--layers", "0"),
                                        ("--lr", "nan"), ("--gamma", "inf"), ("--seq-len", "3")])
def test_bad_training_numbers_are_one_clear_line(setup, tmp_path, flag, value):
    r = CliRunner().invoke(app, ["train-drafter", "--target", str(setup / "target"), "--out", str(tmp_path / "o"),
                                 "--block-size", "6", flag, value])
    assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()                         # refused before any work


def test_resume_without_a_checkpoint_is_refused(setup, tmp_path):
    r = CliRunner().invoke(app, ["train-drafter", "--target", str(setup / "target"), "--out", str(tmp_path / "o"),
                                 "--resume"])
    assert r.exit_code == 2 and "no checkpoint" in r.output and "Traceback" not in r.output, r.output
    (tmp_path / "o" / "checkpoint").mkdir(parents=True)
    (tmp_path / "o" / "checkpoint" / "state.json").write_bytes(b"not a checkpoint")
    r = CliRunner().invoke(app, ["train-drafter", "--target", str(setup / "target"), "--out", str(tmp_path / "o"),
                                 "--resume"])
    assert r.exit_code == 2 and "not a readable cure checkpoint" in r.output and "Traceback" not in r.output, r.output


def test_corpus_helpers(tmp_path):
    files = C.stdlib_files()
    assert files and files == sorted(files) and all(f.suffix == ".py" for f in files)
    docs = [C.Doc("a.py", 'def f(x):\n    """Return x plus one, for any number x."""\n    return x + 1\n\n\ndef g():\n    pass\n')]
    prompts = C.signature_prompts(docs, 5)
    assert prompts == ['def f(x):\n    """Return x plus one, for any number x."""\n']
    many = [C.Doc(str(i), "x" * 10) for i in range(20)]
    tr, he = C.split_docs(many, 0.25, seed=0)
    assert len(he) == 5 and len(tr) == 15 and C.split_docs(many, 0.25, seed=0) == (tr, he)
    chunks = C.chunk_docs(many, lambda s: list(range(len(s))), 4, 3, max_tokens=20)
    assert sum(map(len, chunks)) <= 20 and all(3 <= len(c) <= 4 for c in chunks)


def test_self_distill_corpus_is_the_targets_own_continuations(setup, tmp_path, monkeypatch):
    from cure_core.checkpoints import load_model, load_tokenizer
    from cure_core.training.prepare import build_docs
    # A few stdlib files stand in for the whole library (parsing all of it takes seconds).
    few = [C.Doc(str(p), p.read_text()) for p in C.stdlib_files() if p.name in ("textwrap.py", "shlex.py", "fnmatch.py")]
    monkeypatch.setattr(C, "stdlib_docs", lambda: few)
    model, path = load_model(str(setup / "target"))
    tok = load_tokenizer(path)
    spec = DataSpec(corpus=["self-distill"], distill_prompts=4, distill_tokens=8, heldout_frac=0.25)
    train, held = build_docs(spec, model, tok)
    assert len(train) == 3 and len(held) == 1
    for d in train + held:
        assert d.text.lstrip().startswith(("def ", "async def ", "@"))


def test_pard_can_train_its_embeddings(setup, tmp_path):
    from transformers import AutoModelForCausalLM
    out = tmp_path / "pard-emb"
    opts = _opts(setup, out, "pard", steps=4)
    opts.pard_train_embeddings = True
    opts.save_dtype = "float32"
    run(opts, _bars, log=lambda m: None)
    mine = AutoModelForCausalLM.from_pretrained(out).get_input_embeddings().weight
    theirs = AutoModelForCausalLM.from_pretrained(setup / "target").get_input_embeddings().weight
    assert not torch.equal(mine, theirs)


def test_publish_copies_the_drafters_top_level_files_whole(tmp_path):
    from cure_core.training.run import publish
    out, dest = tmp_path / "run", tmp_path / "assets" / "drafter"
    (out / "checkpoint").mkdir(parents=True)
    for name, text in [("model.safetensors", "w"), ("config.json", "{}"), ("train.json", "t"), ("eval.json", "e"),
                       (".hidden", "h"), ("checkpoint/state.json", "s")]:
        (out / name).write_text(text)
    (dest).mkdir(parents=True)
    (dest / "config.json").write_text("old")
    publish(out, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]   # nothing else, no .part
    assert (dest / "config.json").read_text() == "{}"
