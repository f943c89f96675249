"""`cure export-vllm`: the folder it writes, what it refuses, and that nothing is half-written."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core.catalog import ASSETS
from cure_core.drafters.dflash import load_dflash_model
from cure_core.tiny import BYTE_VOCAB, MASK_ID, byte_tokenizer, save_tiny_pair, tiny_target
from cure_core.training.dflash_train import build_model, draft_config_dict, init_from_target, save_dflash

runner = CliRunner()


def export(*args):
    return runner.invoke(app, ["export-vllm", *map(str, args)])


@pytest.fixture(scope="module")
def dflash(tmp_path_factory):
    """A tiny target and a DFlash drafter saved by our training code, with a draft vocabulary."""
    root = tmp_path_factory.mktemp("export")
    target = tiny_target(seed=0, hidden=64, heads=2, kv_heads=1, layers=4)
    cfg = draft_config_dict(target.config, [0, 2], 1, 6, MASK_ID, attention_bias=False)
    model = build_model(cfg, target.config)
    init_from_target(model, target, [0, 2])
    save_dflash(root / "draft", model, cfg, dtype=torch.float32, draft_vocab=torch.tensor([MASK_ID, *range(0, 200), 5]))
    target.save_pretrained(root / "target")
    byte_tokenizer().save_pretrained(root / "target")
    return root, target


def test_writes_vllms_dflash_layout_and_the_serve_line(dflash, tmp_path):
    root, _ = dflash
    r = export(root / "draft", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "num_speculative_tokens\": 5" in r.stdout and r.stdout.startswith(f"wrote {tmp_path / 'out'}")
    assert "no target given" in r.output and "draft_vocab (202 ids) is dropped" in r.output
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": [0, 2]}
    assert cfg["block_size"] == 6 and cfg["dtype"] == "float32"
    src, out = load_file(str(root / "draft" / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(out) == set(src) - {"draft_vocab"}
    assert all(torch.equal(out[k], src[k]) for k in out)
    note = json.loads((tmp_path / "out" / "cure_export.json").read_text())
    assert note["speculative_config"] == {"method": "dflash", "model": str(tmp_path / "out"), "num_speculative_tokens": 5}


def test_with_the_target_the_export_gets_its_own_head_over_our_draft_ids(dflash, tmp_path):
    root, target = dflash
    r = export(root / "draft", tmp_path / "out", "--target", root / "target", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["head_from"] == str(root / "target")
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    ids = out["d2t"] + torch.arange(out["d2t"].numel())               # vLLM: target id = index + d2t[index]
    assert ids.tolist() == list(range(200))                            # the draft_vocab: mask dropped, no repeats
    assert torch.equal(out["lm_head.weight"], target.lm_head.weight.detach()[ids])   # float32 rows, as loaded
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["draft_vocab_size"] == 200 and cfg["vocab_size"] == BYTE_VOCAB
    # no draft_vocab: every tokenizer id but the mask
    cfg_src = json.loads((root / "draft" / "config.json").read_text())
    model, _ = load_dflash_model(root / "draft", target)
    save_dflash(tmp_path / "plain", model, cfg_src, dtype=torch.float32)
    r = export(tmp_path / "plain", tmp_path / "out2", "--target", root / "target", "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    out = load_file(str(tmp_path / "out2" / "model.safetensors"))
    ids = (out["d2t"] + torch.arange(out["d2t"].numel())).tolist()
    assert ids == [i for i in range(BYTE_VOCAB) if i != MASK_ID] and out["lm_head.weight"].dtype == torch.bfloat16
    r = export(root / "draft", tmp_path / "out3", "--target", root / "target", "--shared-head")
    assert r.exit_code == 2 and "takes no --target" in r.output
    r = export(root / "draft", tmp_path / "out3", "--target", tmp_path / "missing")
    assert r.exit_code == 2 and "--target" in r.output and not (tmp_path / "out3").exists()


def test_the_export_drafts_as_the_original_without_its_vocabulary(dflash, tmp_path):
    """Our loader reads the exported folder: same weights, so the same proposals as the original drafter
    once the original's draft vocabulary is taken away (vLLM drafts over every id)."""
    from cure_core.drafters.dflash import drafter_from_model, load_dflash, load_dflash_model
    root, target = dflash
    assert export(root / "draft", tmp_path / "out").exit_code == 0
    exported = load_dflash(tmp_path / "out", target, vocab_size=BYTE_VOCAB)
    model, vocab = load_dflash_model(root / "draft", target)
    assert vocab is not None and exported.vocab is None
    original = drafter_from_model(model, target, vocab_size=BYTE_VOCAB)
    ids = list(b"def add(a, b):")
    with torch.no_grad():
        res = target(torch.tensor([ids]), output_hidden_states=True)
    hidden = torch.cat([res.hidden_states[i][0] for i in original.target_layers], dim=-1)
    for d in (exported, original):
        d.reset(ids, hidden)
    assert exported.propose(5, 5, 3).tokens == original.propose(5, 5, 3).tokens


def test_default_layers_are_written_out_and_dtype_converts(dflash, tmp_path):
    """A config naming no target_layer_ids gets our loader's default written out (1 draft layer over a 4-layer
    target: layer 4 // 2), so vLLM reads the layers our engine uses."""
    _, target = dflash
    cfg = draft_config_dict(target.config, [2], 1, 6, MASK_ID, attention_bias=False)
    model = build_model(cfg, target.config)
    del cfg["dflash_config"]["target_layer_ids"]
    save_dflash(tmp_path / "nolayers", model, cfg, dtype=torch.float32)
    r = export(tmp_path / "nolayers", tmp_path / "out", "--dtype", "bfloat16", "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["target_layer_ids"] == [2] and obj["dtype"] == "bfloat16"
    assert all(v.dtype == torch.bfloat16 for v in load_file(str(tmp_path / "out" / "model.safetensors")).values())
    cfg.pop("num_target_layers")
    save_dflash(tmp_path / "nolayers", model, cfg, dtype=torch.float32)
    r = export(tmp_path / "nolayers", tmp_path / "out2")
    assert r.exit_code == 2 and "neither target_layer_ids nor num_target_layers" in r.output, r.output


def test_kinds_without_a_vllm_equivalent_are_refused_in_one_line(tmp_path):
    target, pard = save_tiny_pair(tmp_path / "pair")
    for folder, word in ((pard, "PARD"), (target, "autoregressive")):
        r = export(folder, tmp_path / "out")
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and word in lines[0] and "exports these drafter kinds: dflash" in lines[0]
        assert "Traceback" not in r.output
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, expect", [
    ({"input_embedding_scale": 2.0}, "input_embedding_scale=2.0"),
    ({"layer_types": ["sliding_attention"]}, "sliding-window or causal"),
    ({"num_hidden_layers": "1"}, "num_hidden_layers must be an integer"),
])
def test_settings_vllm_cannot_read_are_refused(dflash, tmp_path, change, expect):
    root, _ = dflash
    cfg = {**json.loads((root / "draft" / "config.json").read_text()), **change}
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "model.safetensors").write_bytes((root / "draft" / "model.safetensors").read_bytes())
    r = export(src, tmp_path / "out")
    assert r.exit_code == 2 and expect in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_bad_paths_and_an_existing_out(dflash, tmp_path):
    root, _ = dflash
    r = export(tmp_path / "nope", tmp_path / "out")
    assert r.exit_code == 2 and "drafter folder not found" in r.output
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    r = export(root / "draft", tmp_path / "out")
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert (tmp_path / "out" / "keep.txt").exists()
    r = export(root / "draft", tmp_path / "out", "--overwrite")
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "out" / "keep.txt").exists() and (tmp_path / "out" / "config.json").exists()
    r = export(root / "draft", root / "draft")
    assert r.exit_code == 2 and "own folder" in r.output


def test_a_failed_write_leaves_nothing_behind(dflash, tmp_path, monkeypatch):
    import safetensors.torch
    root, _ = dflash

    def broken(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    r = export(root / "draft", tmp_path / "out")
    assert r.exit_code == 2 and "No space left on device" in r.output
    assert list(tmp_path.iterdir()) == []                            # no OUT, no temporary folder


def test_the_shipped_default_drafter_exports(tmp_path):
    shipped = ASSETS / "drafters" / "qwen-coder-0.5b"
    r = export(shipped, tmp_path / "out", "--json", "--shared-head")     # its target needs the [models] extra
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    cfg = json.loads((Path(obj["out"]) / "config.json").read_text())
    assert obj["speculative_config"]["num_speculative_tokens"] == cfg["block_size"] - 1
    assert cfg["dflash_config"]["target_layer_ids"] == json.loads((shipped / "config.json").read_text())["dflash_config"]["target_layer_ids"]
    assert "draft_vocab" not in load_file(str(Path(obj["out"]) / "model.safetensors"))
