"""Training that resumes anywhere: a self-distilled corpus saved as text and resumed batch by batch,
checkpoints of trainable state only, a resumed run (on a fresh folder holding only the committed
checkpoint and corpus) equal to an uninterrupted one for every kind, the stretches in the cards,
the PARD adaptation of a base model (a delta that loads over the base), and `cure models` listing
drafters."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from cure_core.checkpoints import load_model, load_tokenizer
from cure_core.config import DecodeConfig
from cure_core.engine import generate_ids
from cure_core.models import load_pair
from cure_core.tiny import MASK_ID, byte_tokenizer, perturbed_copy, tiny_target
from cure_core.training import corpus as C
from cure_core.training import distill as Dist
from cure_core.training.prepare import DISTILL_FILE, DataSpec
from cure_core.training.prompt_mix import prompt_mix
from cure_core.training.run import RunOptions, run
from cure_core.training.trainer import TrainSpec

FEW_STDLIB = ("textwrap.py", "shlex.py", "fnmatch.py")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt")
    target = tiny_target(seed=0)
    tok = byte_tokenizer()
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    base = perturbed_copy(target, noise=0.3, seed=5)         # the "small model" a drafter is adapted from
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    return root


@pytest.fixture()
def few_stdlib(monkeypatch):
    few = [C.Doc(str(p), p.read_text()) for p in C.stdlib_files() if p.name in FEW_STDLIB]
    monkeypatch.setattr(C, "stdlib_docs", lambda: few)


def _bars(name, total, initial=0):
    return lambda n=1, loss=None, acc=None: None


def _opts(models, out, kind, steps, **kw):
    spec = dict(kind=kind, steps=steps, block_size=6, lr=3e-3, batch=2, anchors=6, checkpoint_every=4,
                loss_vocab=0, draft_vocab=0)
    opts = dict(pard_init="adapt", pard_base=str(models / "base"), lora_rank=4) if kind == "pard" else {}
    opts.update(kw)
    return RunOptions(target=str(models / "target"), out=out, train=TrainSpec(**spec),
                      data=DataSpec(corpus=["self-distill"], distill_prompts=12, distill_tokens=24,
                                    distill_mix="mixed", distill_batch=4, seq_len=64, heldout_frac=0.2),
                      eval_prompts=0, eval_set="heldout", **opts)


def test_prompt_mix_is_varied_seeded_and_never_an_eval_set(few_stdlib):
    specs = prompt_mix(60, "mixed", seed=0)
    assert specs == prompt_mix(60, "mixed", seed=0) and len({s.text for s in specs}) == 60
    assert {s.kind for s in specs} == {"code-raw", "code-chat", "explain", "math"}
    assert all(not s.chat for s in specs if s.kind == "code-raw") and all(s.chat for s in specs if s.kind != "code-raw")
    langs = {w for s in specs if s.kind == "code-chat" for w in ("Python", "Rust", "Go", "Java", "C") if f" {w} " in s.text}
    assert len(langs) >= 2
    with pytest.raises(ValueError, match="unknown prompt mix"):
        prompt_mix(4, "poems")


def test_distill_corpus_resumes_batch_by_batch(models, few_stdlib, tmp_path):
    model, path = load_model(str(models / "target"))
    tok = load_tokenizer(path)
    specs = prompt_mix(10, "mixed", seed=1)
    meta = {"target": "t", "mix": "mixed", "seed": 1}
    whole = Dist.distill(model, tok, specs, 12, tmp_path / "whole.jsonl", meta, batch=4)
    part = tmp_path / "part.jsonl"

    def stop_after_first_batch(n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Dist.distill(model, tok, specs, 12, part, meta, batch=4, progress=stop_after_first_batch)
    assert len(C.read_corpus(part)[1]) == 4                     # one whole batch saved, as text
    seen = []
    resumed = Dist.distill(model, tok, specs, 12, part, meta, batch=4, progress=seen.append)
    assert seen[0] == 4 and sum(seen) == 10                     # the saved batch counts, then the rest
    assert [d.text for d in resumed] == [d.text for d in whole]
    assert part.read_text() == (tmp_path / "whole.jsonl").read_text()
    # Chat prompts keep their template's special tokens, so the text tokenizes back to the decode-time ids.
    chat = [r for r in C.read_corpus(part)[1] if r["kind"] != "code-raw"]
    assert chat and all(r["text"].startswith("<|im_start|>") for r in chat)
    assert C.file_docs([part]) == resumed                       # --corpus FILE.jsonl reads the same documents
    with pytest.raises(Dist.CorpusMismatch, match="new_tokens"):
        Dist.distill(model, tok, specs, 13, part, meta, batch=4)


@pytest.mark.parametrize("kind", ["dflash", "pard"])
def test_resume_on_a_fresh_machine_equals_an_uninterrupted_run(models, few_stdlib, tmp_path, kind):
    full = tmp_path / "full"
    run(_opts(models, full, kind, steps=8), _bars, log=lambda m: None)
    first = tmp_path / "first"
    run(_opts(models, first, kind, steps=4), _bars, log=lambda m: None)
    # What a commit carries to another machine: the checkpoint and the corpus text, no features.
    fresh = tmp_path / "fresh"
    for sub in ("checkpoint", "corpus"):
        shutil.copytree(first / sub, fresh / sub)
    assert not list((first / "checkpoint").glob("*.pt"))
    msgs = []
    res = run(_opts(models, fresh, kind, steps=8, resume=True), _bars, log=msgs.append)
    assert any("resumed" in m and "step 4" in m for m in msgs) and res["train"]["steps_done"] == 8
    weights = "model.safetensors" if kind == "dflash" else "adapter.safetensors"
    a, b = load_file(str(full / weights)), load_file(str(fresh / weights))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ha = json.loads((full / "train.json").read_text())
    hb = json.loads((fresh / "train.json").read_text())
    assert [h["loss"] for h in ha["history"]] == [h["loss"] for h in hb["history"]]
    # Every stretch is recorded, in train.json, drafter.json and the model card.
    assert [(s["start_step"], s["end_step"], s["stopped_by"]) for s in hb["stretches"]] == [(0, 4, "steps"), (4, 8, "steps")]
    card = json.loads((fresh / "drafter.json").read_text())
    assert card["training"]["steps"] == 8 and len(card["training"]["stretches"]) == 2
    assert card["kind"] == kind and card["block_size"] == 6
    md = (fresh / "MODEL_CARD.md").read_text()
    assert "| 1 | 0-4 |" in md and "| 2 | 4-8 |" in md and "| total | 8 |" in md


def test_checkpoint_holds_trainable_state_only_in_small_shards(models, few_stdlib, tmp_path, monkeypatch):
    from cure_core.training import checkpoint as ck
    monkeypatch.setattr(ck, "SHARD_BYTES", 40_000)
    out = tmp_path / "pard"
    spec = _opts(models, out, "pard", steps=2)
    spec.train.labels = "text"                  # the corpus answers are the target's: no target pass needed
    run(spec, _bars, log=lambda m: None)
    assert not (out / "features").exists()
    shards = sorted((out / "checkpoint").glob("shard-*.safetensors"))
    assert len(shards) > 1
    names = set()
    for s in shards:
        names |= set(load_file(str(s)))
    # LoRA factors, the mask embedding and their AdamW moments; never a frozen base weight.
    assert all(".lora_" in n or "cure_mask_embedding" in n for n in names)
    assert {n.split(".", 1)[0] for n in names} == {"param", "exp_avg", "exp_avg_sq", "step"}


def test_adapted_drafter_is_a_small_delta_that_loads_over_its_base(models, few_stdlib, tmp_path):
    out = tmp_path / "adapted"
    opts = _opts(models, out, "pard", steps=6, save_dtype="float32", publish=tmp_path / "shipped")
    run(opts, _bars, log=lambda m: None)
    shipped = tmp_path / "shipped"
    assert sorted(f.name for f in shipped.iterdir()) == ["MODEL_CARD.md", "adapter.safetensors", "config.json",
                                                         "drafter.json"]
    cfg = json.loads((shipped / "config.json").read_text())["cure_adapter"]
    assert cfg["base"] == str(models / "base") and cfg["kind"] == "pard" and cfg["block_size"] == 6
    base_bytes = sum(f.stat().st_size for f in (models / "base").glob("*.safetensors"))
    assert (shipped / "adapter.safetensors").stat().st_size < base_bytes / 2
    loaded = load_pair(str(models / "target"), str(shipped), drafter="auto", kernels="eager")
    assert loaded.drafter_kind == "pard" and loaded.pair.drafter.mask_token_id == cfg["mask_token_id"]
    assert loaded.pair.drafter.block_size == 6
    # The merged model equals the base with the LoRA update applied by hand.
    delta = load_file(str(shipped / "adapter.safetensors"))
    base, _ = load_model(str(models / "base"))
    merged = loaded.pair.drafter.model
    name = "model.layers.0.self_attn.q_proj"
    want = base.get_submodule(name).weight + cfg["alpha"] / cfg["rank"] * delta[f"{name}.lora_B"] @ delta[f"{name}.lora_A"]
    torch.testing.assert_close(merged.get_submodule(name).weight, want)
    assert torch.equal(merged.get_input_embeddings().weight[MASK_ID], delta["mask_embedding"])
    # Lossless whatever it learned.
    tok = loaded.tokenizer
    ids = tok.encode("def g(x, y):\n    total = ", add_special_tokens=False)
    ref = generate_ids(loaded.pair, DecodeConfig.of(strategy="ar", max_new_tokens=20, k=6), ids)
    for strat in ("parallel", "cure"):
        assert generate_ids(loaded.pair, DecodeConfig.of(strategy=strat, max_new_tokens=20, k=6), ids) == ref


def test_adapt_options_are_checked(models, tmp_path):
    from cure_core.training.run import TrainError
    with pytest.raises(TrainError, match="--pard-base"):
        run(_opts(models, tmp_path / "x", "pard", steps=1, pard_base=None), _bars)
    bad = _opts(models, tmp_path / "y", "pard", steps=1)
    bad.data.distill_mix = "poems"
    with pytest.raises(TrainError, match="--distill-mix"):
        run(bad, _bars)


def test_models_lists_shipped_drafters(tmp_path, monkeypatch):
    from cure_cli import models_cmd
    from cure_cli.main import app
    d = tmp_path / "drafters" / "qwen-coder-1.5b"
    d.mkdir(parents=True)
    (d / "drafter.json").write_text(json.dumps({
        "target": "qwen-coder-1.5b", "kind": "pard", "base": "qwen-coder-0.5b", "block_size": 8, "draft_vocab": None,
        "training": {"steps": 10, "minutes": 1.5, "stretches": []},
        "tau": [{"prompts": "humaneval 21-40", "strategy": "cure", "k": 8, "tau": 3.25, "source": "bench"},
                {"prompts": "humaneval 21-40", "strategy": "parallel", "k": 8, "tau": 2.5, "source": "bench"}]}))
    (tmp_path / "drafters" / "no-card").mkdir()
    monkeypatch.setattr(models_cmd, "DRAFTERS", tmp_path / "drafters")
    res = CliRunner().invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert [m["alias"] for m in got["models"]][:1] == ["qwen-coder-0.5b"]
    (row,) = got["drafters"]
    assert (row["alias"], row["kind"], row["base"], row["block_size"], row["draft_vocab"]) == \
        ("qwen-coder-1.5b", "pard", "qwen-coder-0.5b", 8, None)
    assert [r["tau"] for r in row["tau"]] == [3.25, 2.5]
    res = CliRunner().invoke(app, ["models"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "qwen-coder-1.5b" in ln and "pard" in ln)
    assert "adapted qwen-coder-0.5b" in line and "3.25 cure K=8 (humaneval 21-40)" in line and "all" in line


def test_dflash_init_starts_a_further_version_from_a_trained_drafters_weights(models, tmp_path):
    """--dflash-init: a v(n+1) drafter trains on from v(n)'s weights (not the target's last layer); a
    drafter of another shape is refused in one line before the feature pass."""
    from cure_core.training import dflash_train as D
    from cure_core.training.run import TrainError
    first = tmp_path / "v1"
    run(_opts(models, first, "dflash", steps=3, save_dtype="float32"), _bars, log=lambda m: None)
    cfg = json.loads((first / "config.json").read_text())
    state = D.read_init_drafter(first, cfg)
    assert "draft_vocab" not in state
    target = load_model(str(models / "target"))[0]
    model = D.build_model(cfg, target.config)
    D.init_from_target(model, target, cfg["dflash_config"]["target_layer_ids"])
    saved = load_file(str(first / "model.safetensors"))
    k = "layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[k], saved[k])    # trained: no longer the target's copy
    D.init_from_state(model, state)
    for name, v in model.state_dict().items():
        if "rotary_emb" not in name:
            assert torch.equal(v, saved[name]), name
    # end to end: the run records where it started and trains on
    second = tmp_path / "v2"
    res = run(_opts(models, second, "dflash", steps=2, dflash_init=first), _bars, log=lambda m: None)
    assert res["train"]["dflash_init"] == str(first) and res["train"]["steps_done"] == 2
    # another shape (2 layers against 1): refused before any feature is computed
    third = tmp_path / "v3"
    bad = _opts(models, third, "dflash", steps=2, dflash_init=first)
    bad.train.layers = 2
    with pytest.raises(TrainError, match="num_hidden_layers is 1, this training builds 2"):
        run(bad, _bars, log=lambda m: None)
    assert not third.exists()                                  # nothing written
    with pytest.raises(TrainError, match="--kind pard takes --pard-init"):
        run(_opts(models, third, "pard", steps=2, dflash_init=first), _bars, log=lambda m: None)


def test_adapter_init_starts_a_further_adapter_from_a_trained_one(models, tmp_path):
    """--adapter-init (the PARD twin of --dflash-init): a further adapter starts from a trained one's LoRA
    factors and mask embedding, not from a no-op adapter; the base comes from the adapter when --pard-base
    is left out; another rank, another base or a DFlash run is refused in one line, with nothing written."""
    from cure_core.drafters.adapted import read_adapter
    from cure_core.training.adapt_train import LoRALinear, attach, init_from_adapter
    from cure_core.training.run import TrainError
    first = tmp_path / "a1"
    run(_opts(models, first, "pard", steps=3, save_dtype="float32"), _bars, log=lambda m: None)
    ad, tensors = read_adapter(first)
    base = load_model(str(models / "base"))[0]
    model = attach(base, 4, 16.0, MASK_ID)
    lora = next(m for m in model.modules() if isinstance(m, LoRALinear))
    assert not lora.lora_B.detach().any()                      # a fresh adapter is a no-op
    init_from_adapter(model, tensors)
    for name, mod in model.named_modules():
        if isinstance(mod, LoRALinear):
            assert torch.equal(mod.lora_A.detach(), tensors[f"{name}.lora_A"])
            assert torch.equal(mod.lora_B.detach(), tensors[f"{name}.lora_B"])
    assert any(v.any() for k, v in tensors.items() if k.endswith(".lora_B"))   # trained: no longer a no-op
    assert torch.equal(model.cure_mask_embedding.detach(), tensors["mask_embedding"])
    # end to end, the base taken from the adapter: the run records where it started and trains on
    second = tmp_path / "a2"
    res = run(_opts(models, second, "pard", steps=2, adapter_init=first, pard_base=None), _bars, log=lambda m: None)
    assert res["train"]["adapter_init"] == str(first) and res["train"]["steps_done"] == 2
    assert read_adapter(second)[0]["base"] == ad["base"]
    third = tmp_path / "a3"
    for bad, match in ((dict(lora_rank=8), "has rank 4 and alpha 16.0"),
                       (dict(pard_base=str(models / "target")), "adapts .*base, not --pard-base"),
                       (dict(pard_init="shrink"), "needs --kind pard --pard-init adapt")):
        with pytest.raises(TrainError, match=match):
            run(_opts(models, third, "pard", steps=2, adapter_init=first, **bad), _bars, log=lambda m: None)
    with pytest.raises(TrainError, match="needs --kind pard"):
        run(_opts(models, third, "dflash", steps=2, adapter_init=first), _bars, log=lambda m: None)
    with pytest.raises(TrainError, match="--adapter-init: .*not an adapted drafter"):
        run(_opts(models, third, "pard", steps=2, adapter_init=tmp_path), _bars, log=lambda m: None)
    assert not third.exists()                                  # nothing written


def test_features_from_copies_the_chunks_another_run_computed(models, tmp_path, monkeypatch):
    """--features-from: a further version trained on an old corpus plus a new one copies the old chunks'
    features from the old run's folder and runs the target over the new chunks only; the result equals
    a fresh extraction, chunk for chunk (control: without donors every chunk is a target forward). A
    donor of other layers is refused, and `run` refuses it in one line before any feature pass."""
    from cure_core.training import features as F
    from cure_core.training.prepare import prepare_features
    from cure_core.training.run import TrainError

    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("".join(f"def old_{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(40)))
    new.write_text("".join(f"class New{i}:\n    value = '{i}' * {i}\n\n" for i in range(40)))
    target, tpath = load_model(str(models / "target"))
    tok = load_tokenizer(tpath)
    calls = []
    forward = F.target_forward
    monkeypatch.setattr(F, "target_forward", lambda m, ids, layers: (calls.append(1), forward(m, ids, layers))[1])

    def extract(folder, corpus, **kw):
        calls.clear()
        spec = DataSpec(corpus=[str(p) for p in corpus], seq_len=64, max_tokens=None, heldout_frac=0.0)
        fs, _, chunks = prepare_features(spec, target, tok, "tiny", [0, 1], folder / "features", min_len=8, **kw)
        return fs, chunks, len(calls)

    _, chunks_old, n_old = extract(tmp_path / "v1", [old])
    fresh, chunks, n_fresh = extract(tmp_path / "control", [old, new])
    assert n_old == len(chunks_old) and n_fresh == len(chunks) > n_old          # control: all computed
    got, chunks2, n_got = extract(tmp_path / "v2", [old, new], features_from=[tmp_path / "v1" / "features"])
    assert chunks2 == chunks and n_got == len(chunks) - len(chunks_old)         # only the new chunks ran
    for a, b in zip(fresh.tokens + fresh.argmax + fresh.features, got.tokens + got.argmax + got.features):
        assert torch.equal(a, b)
    with pytest.raises(F.DonorError, match=r"this run needs tiny layers \[1\]"):
        prepare_features(DataSpec(corpus=[str(new)], seq_len=64, heldout_frac=0.0), target, tok, "tiny", [1],
                         tmp_path / "v3" / "features", min_len=8, features_from=[tmp_path / "v1" / "features"])
    opts = _opts(models, tmp_path / "v4", "dflash", steps=1, features_from=[tmp_path / "v1"])
    with pytest.raises(TrainError, match="no readable meta.json"):
        run(opts, _bars, log=lambda m: None)
    assert not (tmp_path / "v4").exists()                                     # nothing written
