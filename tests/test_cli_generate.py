"""`cure generate` end to end on tiny saved checkpoints, and its bad-input errors."""
import json

import pytest
from typer.testing import CliRunner

from cure_cli.main import app
from cure_core.tiny import byte_tokenizer, save_tiny_pair, tiny_target

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("tiny"))


def gen(*args):
    return runner.invoke(app, ["generate", *map(str, args)])


def test_json_output_is_one_object_and_lossless(tiny_dirs, tmp_path):
    t, d = tiny_dirs
    outs = {}
    for strategy in ("ar", "sd", "parallel", "cure", "ddtree"):
        r = gen("def f(x):", "--target", t, "--draft", d, "--raw", "-n", 24, "--k", 6, "--strategy", strategy,
                "--json", "--trace", tmp_path / f"{strategy}.jsonl")
        assert r.exit_code == 0, r.output
        obj = json.loads(r.stdout)
        assert set(obj) == {"text", "token_ids", "strategy", "stats", "kernels", "draft_vocab"}
        assert obj["draft_vocab"] == 16384                   # --draft-vocab auto on a CPU
        assert set(obj["stats"]) == {"tau", "tpot_ms", "tokens_per_s", "blocks", "new_tokens",
                                     "repair_win_rate", "mean_tree_size"}
        assert obj["stats"]["new_tokens"] == len(obj["token_ids"]) == 24
        outs[strategy] = obj["token_ids"]
    assert all(v == outs["ar"] for v in outs.values())


def test_streams_text_then_stats_line(tiny_dirs):
    t, d = tiny_dirs
    r = gen("hello", "--target", t, "--draft", d, "-n", 8)
    assert r.exit_code == 0, r.output
    assert "tau" in r.stderr and "tok/s" in r.stderr


@pytest.mark.parametrize("args,expect", [
    (["--target", "/nonexistent/model"], "not found"),
    (["--target", "nobody/unknown-model-xyz"], "unknown model"),
    (["--k", "1"], "K must be at least 2"),
    (["--v-max", "3"], "v_max"),
    (["--strategy", "fast"], "unknown strategy"),
    (["--drafter", "magic"], "unknown drafter"),
    (["--draft-vocab", "-3"], "--draft-vocab"),
    (["--draft-vocab", "lots"], "--draft-vocab"),
])
def test_bad_input_is_one_clear_line(tiny_dirs, args, expect):
    t, d = tiny_dirs
    base = ["hello", "--target", t, "--draft", d]
    if "--target" in args:
        base = ["hello", "--draft", d]
    r = gen(*base, *args)
    assert r.exit_code != 0
    assert expect in r.stderr
    assert "Traceback" not in r.output and "Traceback" not in r.stderr
    # one error line (plus the progress lines of what loaded before K was known: `loading …`)
    assert len([x for x in r.stderr.strip().splitlines() if x and not x.endswith("…")]) <= 2


def test_empty_and_too_long_prompt(tiny_dirs):
    t, d = tiny_dirs
    r = gen("   ", "--target", t, "--draft", d)
    assert r.exit_code != 0 and "prompt is empty" in r.stderr
    r = gen("x" * 600, "--target", t, "--draft", d, "--raw")     # context is 512 tokens
    assert r.exit_code != 0 and "context holds 512" in r.stderr and "Traceback" not in r.stderr


def test_tokenizer_mismatch(tiny_dirs, tmp_path):
    t, _ = tiny_dirs
    other = tmp_path / "other"
    tiny_target(seed=5).save_pretrained(other)
    byte_tokenizer().save_pretrained(other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = list(vocab)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]                 # same tokens, two ids swapped
    (other / "tokenizer.json").write_text(json.dumps(spec))
    r = gen("hello", "--target", t, "--draft", other, "--drafter", "ar", "--strategy", "sd")
    assert r.exit_code != 0 and "tokenizer mismatch" in r.stderr


def test_pard_without_mask_token_is_refused(tiny_dirs, tmp_path):
    t, _ = tiny_dirs
    plain = tmp_path / "plain"
    tiny_target(seed=2).save_pretrained(plain)
    r = gen("hello", "--target", t, "--draft", plain, "--drafter", "pard")
    assert r.exit_code != 0 and "mask token" in r.stderr


def test_a_causal_draft_vocabulary_changes_the_drafts_not_the_output(tiny_dirs):
    """--draft-vocab N: the PARD drafter proposes ids < N plus the context's; same tokens as ar."""
    t, d = tiny_dirs
    outs = {}
    for n in ("0", "100"):
        for strategy in ("ar", "cure", "sd"):
            r = gen("def f(x):", "--target", t, "--draft", d, "--raw", "-n", 20, "--k", 6, "--strategy", strategy,
                    "--draft-vocab", n, "--json")
            assert r.exit_code == 0, r.output
            obj = json.loads(r.stdout)
            assert obj["draft_vocab"] == int(n)
            outs[(n, strategy)] = obj["token_ids"]
    assert len({tuple(v) for v in outs.values()}) == 1


def test_draft_vocab_auto_is_a_cpu_default():
    from cure_core.options import CPU_DRAFT_VOCAB, EngineArgs

    def resolve_draft_vocab(n, device, device_map=None):
        return EngineArgs(draft_vocab=n, device=device, device_map=device_map).draft_vocab_ids()
    assert resolve_draft_vocab("auto", "cpu") == CPU_DRAFT_VOCAB
    assert resolve_draft_vocab("auto", "cuda") == 0 == resolve_draft_vocab("auto", "cpu", device_map="auto")
    assert resolve_draft_vocab("4096", "cuda") == 4096 and resolve_draft_vocab("0", "cpu") == 0
