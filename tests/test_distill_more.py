"""training/distill_more.py: a further corpus's prompts are new (none of the extended corpus's), each once."""
import importlib.util
from pathlib import Path

from cure_core.training.prompt_mix import prompt_mix

SCRIPT = Path(__file__).resolve().parent.parent / "training" / "distill_more.py"


def load_script():
    spec = importlib.util.spec_from_file_location("distill_more", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fresh_prompts_exclude_the_extended_corpus_and_repeat_nothing():
    mod = load_script()
    old = {p.text for p in prompt_mix(64, "mixed", seed=0)}
    new = mod.fresh_prompts(64, "mixed", seed=1, exclude_seed=0, exclude_n=64)
    texts = [p.text for p in new]
    assert len(texts) == 64 == len(set(texts))
    assert not old & set(texts)
    # the mixes share templates: without the exclusion some would repeat
    assert old & {p.text for p in prompt_mix(64, "mixed", seed=1)}


def test_bad_arguments_exit_2_before_loading(capsys):
    mod = load_script()
    assert mod.main(["--target", "nope", "--seed", "1", "--out", "corpus.txt"]) == 2
    assert "--out must be a .jsonl file" in capsys.readouterr().err
    assert mod.main(["--target", "nope", "--seed", "0", "--exclude-prompts", "8", "--out", "c.jsonl"]) == 2
