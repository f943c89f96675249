"""Which models run when the user names none (cure_core/catalog.py): the shipped drafters under
assets/drafters/ are the block strategies' defaults, the chain draft stays sd's (#14 item 1)."""
import hashlib
import json

from cure_core.catalog import (AR_DRAFT_FOR, ASSETS, CURE_OVER_CHAIN, DEFAULT_TARGET, choose_models, read_card,
                                shipped_drafter)
from cure_core.drafters.adapted import adapter_config, is_adapted_checkpoint

ALL = ("ar", "sd", "parallel", "cure", "ddtree")


def test_the_15b_alias_drafts_blocks_with_its_shipped_pard_adapter_and_chains_with_the_05b():
    shipped = shipped_drafter("qwen-coder-1.5b")
    assert shipped == str(ASSETS / "drafters" / "qwen-coder-1.5b")
    c = choose_models("qwen-coder-1.5b", None, None, ALL)
    assert (c.draft, c.ar_draft, c.unavailable) == (shipped, AR_DRAFT_FOR["qwen-coder-1.5b"], {})
    assert c.ar_draft == "qwen-coder-0.5b"
    # cure repairs the chain draft's chains on this target; parallel and ddtree keep the shipped drafter
    assert c.chain_strategies == {"sd", "cure"} and c.chain_k == CURE_OVER_CHAIN["qwen-coder-1.5b"] == 8
    # sd alone loads no block drafter; ar alone loads nothing but the target
    assert choose_models("qwen-coder-1.5b", None, None, ["sd"]).draft is None
    assert choose_models("qwen-coder-1.5b", None, None, ["ar"]).ar_draft is None
    # cure alone loads the chain draft only, at the K it was measured at; parallel alone no chain draft
    c = choose_models("qwen-coder-1.5b", None, None, ["cure"])
    assert (c.draft, c.ar_draft, c.unavailable, c.chain_k) == (None, "qwen-coder-0.5b", {}, 8)
    c = choose_models("qwen-coder-1.5b", None, None, ["parallel", "ddtree"])
    assert (c.draft, c.ar_draft, c.chain_strategies) == (shipped, None, {"sd"})
    # a named draft wins: the chain draft is one --draft away, and then doubles as sd's
    c = choose_models("qwen-coder-1.5b", "qwen-coder-0.5b", None, ALL)
    assert (c.draft, c.ar_draft) == ("qwen-coder-0.5b", None)
    # ... and every block strategy, cure too, drafts with a named draft (the shipped PARD is one path away)
    c = choose_models("qwen-coder-1.5b", shipped, None, ALL)
    assert (c.draft, c.ar_draft, c.chain_strategies, c.chain_k) == (shipped, "qwen-coder-0.5b", {"sd"}, None)
    # a named chain draft is the one cure repairs
    c = choose_models("qwen-coder-1.5b", None, "some/other-chain", ["cure"])
    assert (c.draft, c.ar_draft, c.chain_strategies) == (None, "some/other-chain", {"sd", "cure"})


def test_the_default_target_keeps_its_dflash_drafter_and_has_no_chain_draft():
    c = choose_models(None, None, None, ALL)
    assert c.target == DEFAULT_TARGET and c.draft == shipped_drafter(DEFAULT_TARGET)
    assert c.ar_draft is None                                   # the 0.5B has no chain draft of its own
    assert c.chain_strategies == {"sd"} and c.chain_k is None   # cure repairs the DFlash drafter's blocks
    # a target alias with no shipped drafter and no chain draft: block strategies say why, nothing loads
    c = choose_models("smollm2-135m", None, None, ALL)
    assert c.draft is None and set(c.unavailable) == {"parallel", "cure", "ddtree", "sd"}
    # a folder or HF id is never an alias (a path must not escape assets/)
    assert shipped_drafter("../drafters/qwen-coder-1.5b") is None


def test_the_shipped_15b_drafter_is_a_small_delta_on_the_embedded_05b_with_its_card():
    d = ASSETS / "drafters" / "qwen-coder-1.5b"
    assert is_adapted_checkpoint(d)
    ad = adapter_config(d)
    assert (ad["kind"], ad["base"], ad["block_size"]) == ("pard", "qwen-coder-0.5b", 8)
    size = sum(f.stat().st_size for f in d.iterdir())
    assert size <= 60e6                                         # #14: ships at <= 60 MB, no base copy
    assert not any(f.name in ("model.safetensors", "pytorch_model.bin") for f in d.iterdir())
    card = read_card(d)
    assert (card.target, card.kind, card.base, card.block_size) == ("qwen-coder-1.5b", "pard", "qwen-coder-0.5b", 8)
    assert card.tau and all(r.source.startswith("benchmarks/results/") for r in card.tau)
    for r in card.tau:
        assert (ASSETS.parent / r.source).is_dir(), r.source
    # the shipped copy is the training run's drafter: the run folder records its sha256 (the weights ship once)
    run = ASSETS.parent / "training" / "qwen-coder-1.5b-pard-full"
    digest, name = (run / "adapter.sha256").read_text().split()
    assert name == "adapter.safetensors" and hashlib.sha256((d / name).read_bytes()).hexdigest() == digest
    assert json.loads((run / "config.json").read_text()) == json.loads((d / "config.json").read_text())
