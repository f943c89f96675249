"""`cure generate` end to end on tiny saved checkpoints, and its bad-input errors."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cure_cli.main import app
from conftest import AUTO_DTYPE
from cure_core.models import auto_draft_dtype
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
        assert set(obj) == {"text", "token_ids", "strategy", "stats", "kernels", "draft_vocab", "draft_dtype"}
        # --draft-dtype auto: int8 (else bfloat16) for this causal (PARD) drafter where a CPU packs it, else the target's
        assert obj["draft_dtype"] == auto_draft_dtype(AUTO_DTYPE, "cpu", None, "auto")
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
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--temperature", "inf"], "temperature must be a finite number"),
    (["--tau-margin", "nan"], "--tau-margin must be a finite number"),
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


@pytest.mark.parametrize("chat", ["--raw", "--chat"])
def test_a_prompt_that_is_not_utf8_is_one_clear_line(tiny_dirs, chat):
    t, d = tiny_dirs
    prompt = b"hi \xff there".decode("utf-8", "surrogateescape")    # what Python makes of such an argv
    r = gen(prompt, "--target", t, "--draft", d, chat, "-n", 4)
    assert r.exit_code == 2 and "not valid UTF-8 text (byte 0xff at character 3)" in r.stderr, r.output
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1


def test_the_prompt_text_is_checked_once(tiny_dirs, monkeypatch):
    """`cure generate` checks the text before loading; the CheckedText it gets back is not checked again
    when the prompt is encoded (prompt_text.check_text makes one per check)."""
    from cure_core import prompt_text
    made = []

    class Counted(prompt_text.CheckedText):
        def __new__(cls, text):
            made.append(text)
            return super().__new__(cls, text)
    monkeypatch.setattr(prompt_text, "CheckedText", Counted)
    t, d = tiny_dirs
    for chat in ("--raw", "--chat"):
        made.clear()
        r = gen("hello", "--target", t, "--draft", d, chat, "-n", 4)
        assert r.exit_code == 0, r.output
        assert made == ["hello"]


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


def test_a_trace_path_that_cannot_be_written_fails_before_loading(tiny_dirs, tmp_path):
    t, d = tiny_dirs
    r = gen("hello", "--target", t, "--draft", d, "--trace", tmp_path)                  # a directory
    assert r.exit_code == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr
    r = gen("hello", "--target", t, "--draft", d, "--trace", tmp_path / "nope" / "t.jsonl")
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_sigterm_keeps_what_was_generated_like_ctrl_c(tiny_dirs, tmp_path):
    """`kill` during a generation: exit 130, the trace closed as interrupted with the blocks so far, no .part."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from cure_core.trace import read_trace
    t, d = tiny_dirs
    trace = tmp_path / "t.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, "-m", "cure_cli.main", "generate", "x = 1", "--target", str(t), "--draft",
                             str(d), "--raw", "-n", "100000", "--trace", str(trace), "--strategy", "ar"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    def blocks_written() -> int:                                    # the trace flushes one line per block
        return sum(p.read_text().count('"block"') for p in tmp_path.glob(".t.jsonl.*.part"))
    deadline = time.time() + 120
    while time.time() < deadline and blocks_written() < 3 and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)                                # at once: the tiny model writes ~300 blocks/s
    err = proc.communicate(timeout=60)[1].decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    got = read_trace(trace)
    assert got.footer["status"] == "interrupted" and got.generations[0].blocks
    assert not list(tmp_path.glob("*.part"))


def test_an_in_process_run_leaves_the_sigterm_handler_as_it_found_it(tiny_dirs):
    import signal
    t, d = tiny_dirs
    before = signal.getsignal(signal.SIGTERM)
    r = gen("hello", "--target", t, "--draft", d, "-n", 4)
    assert r.exit_code == 0, r.output
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_as_interrupt_interrupts_inside_only():
    import os
    import signal
    from cure_cli.common import sigterm_as_interrupt
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)            # the handler runs before kill returns to Python
    assert signal.getsignal(signal.SIGTERM) is before
