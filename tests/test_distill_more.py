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


def write_header(path, meta, specs):
    import json
    from cure_core.training.distill import prompts_sha
    path.write_text(json.dumps({"meta": dict(meta, prompts=len(specs), prompts_sha=prompts_sha(specs))}) + "\n")


def test_exclude_corpus_rebuilds_the_extended_corpora_recursively(tmp_path):
    mod = load_script()
    first = prompt_mix(48, "mixed", seed=0)
    second = mod.fresh_prompts(48, "mixed", seed=1, exclude_seed=0, exclude_n=48)
    write_header(tmp_path / "a.jsonl", {"mix": "mixed", "seed": 0}, first)
    write_header(tmp_path / "b.jsonl", {"mix": "mixed", "seed": 1, "excludes": {"seed": 0, "prompts": 48}}, second)
    from cure_core.training.distill import read_corpus
    metas = [read_corpus(tmp_path / n)[0] for n in ("a.jsonl", "b.jsonl")]
    assert [p.text for p in mod.meta_prompts(metas[1])] == [p.text for p in second]
    both = {p.text for p in first + second}
    third = mod.fresh_prompts(48, "mixed", seed=2, excluded=both)
    assert len({p.text for p in third}) == 48 and not both & {p.text for p in third}
    # a header written by --exclude-corpus (a list of the excluded headers) rebuilds too
    write_header(tmp_path / "c.jsonl", {"mix": "mixed", "seed": 2, "excludes": metas}, third)
    assert [p.text for p in mod.meta_prompts(read_corpus(tmp_path / "c.jsonl")[0])] == [p.text for p in third]


def test_exclude_corpus_whose_prompts_cannot_be_rebuilt_exits_2(tmp_path, capsys):
    mod = load_script()
    write_header(tmp_path / "a.jsonl", {"mix": "mixed", "seed": 0}, prompt_mix(16, "mixed", seed=3))
    assert mod.main(["--target", "nope", "--seed", "1", "--exclude-corpus", str(tmp_path / "a.jsonl"),
                     "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "cannot rebuild the prompts" in capsys.readouterr().err
    assert mod.main(["--target", "nope", "--seed", "1", "--exclude-corpus", str(tmp_path / "missing.jsonl"),
                     "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "--exclude-corpus" in capsys.readouterr().err
    assert not (tmp_path / "c.jsonl").exists()


def test_a_code_corpus_excludes_the_code_prompts_of_a_mixed_corpus(tmp_path, capsys):
    """The mixed mix holds raw code completions too: a code-mix corpus that extends a mixed corpus repeats
    none of them (each header's prompts are rebuilt from ITS mix); the very mix and seed drawn is refused."""
    mod = load_script()
    mixed = prompt_mix(96, "mixed", seed=0)
    write_header(tmp_path / "m.jsonl", {"mix": "mixed", "seed": 0}, mixed)
    from cure_core.training.distill import read_corpus
    excluded = {p.text for p in mod.meta_prompts(read_corpus(tmp_path / "m.jsonl")[0])}
    code = {p.text for p in prompt_mix(400, "code", seed=0)}
    assert excluded & code                                   # the two mixes share stdlib completions
    new = mod.fresh_prompts(64, "code", seed=0, excluded=excluded)
    assert len({p.text for p in new}) == 64 and not excluded & {p.text for p in new}
    write_header(tmp_path / "c0.jsonl", {"mix": "code", "seed": 0}, prompt_mix(16, "code", seed=0))
    assert mod.main(["--target", "nope", "--mix", "code", "--seed", "0", "--exclude-corpus",
                     str(tmp_path / "c0.jsonl"), "--out", str(tmp_path / "c.jsonl")]) == 2
    assert "another mix or seed" in capsys.readouterr().err
