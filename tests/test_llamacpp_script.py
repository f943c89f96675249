"""benchmarks/llamacpp.py without llama.cpp: its parsers on output recorded from the real binaries (built as
benchmarks/README.md says), the command lines it builds, its one-line refusals, and a whole run on the tiny
models with stand-in binaries that print the recorded output."""
from __future__ import annotations

from conftest import AUTO_DTYPE
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import llamacpp  # noqa: E402

# Recorded: llama-completion on qwen-coder-0.5b.gguf, one chat-templated prompt, -n 16, 2 threads (the
# stderr's load lines cut; the perf lines as printed).
AR_STDOUT = "Here's a simple Python function that returns the square of a given number:\n\n```\n\n"
AR_STDERR = (
    '0.43.289.394 I common_perf_print:    sampling time =       7.99 ms\n'
    '0.43.289.396 I common_perf_print:    samplers time =       2.02 ms /    56 tokens\n'
    '0.43.289.403 I common_perf_print:        load time =    6164.66 ms\n'
    '0.43.289.405 I common_perf_print: prompt eval time =    5426.92 ms /    40 tokens (  135.67 ms per token,     7.37 tokens per second)\n'
    '0.43.289.407 I common_perf_print:        eval time =   30498.36 ms /    15 runs   ( 2033.22 ms per token,     0.49 tokens per second)\n'
    '0.43.289.407 I common_perf_print:       total time =   35949.63 ms /    55 tokens\n'
    '0.43.289.408 I common_perf_print: unaccounted time =      16.36 ms /   0.0 %      (total - sampling - prompt eval - eval) / (total)\n'
    '0.43.289.408 I common_perf_print:    graphs reused =         14\n'
)
# Recorded: llama-speculative-simple, qwen-coder-1.5b.gguf drafted by qwen-coder-0.5b.gguf, the same prompt.
SPEC_PROMPT = (
    '<|im_start|>system\n'
    'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n'
    '<|im_start|>user\n'
    'Write a Python function that returns the square of x.<|im_end|>\n'
    '<|im_start|>assistant\n'
)
SPEC_STDOUT = "\n\n" + SPEC_PROMPT + '```python\ndef square(x):\n    """\n    Calculate the square of a given number x.\n\n    Args\n\n\n\n'
SPEC_STDERR = (
    '1.03.796.822 I encoded   40 tokens in    8.207 seconds, speed:    4.874 t/s\n'
    '1.03.796.824 I decoded   21 tokens in   37.842 seconds, speed:    0.555 t/s\n'
    '1.03.796.824 I \n'
    '1.03.796.824 I n_draft   = 8\n'
    '1.03.796.824 I n_predict = 21\n'
    '1.03.796.825 I n_drafted = 33\n'
    '1.03.796.825 I n_accept  = 16\n'
    '1.03.796.826 I accept    = 48.485%\n'
    '1.03.796.826 I \n'
    '1.03.796.827 I draft:\n'
    '\n'
    '1.03.796.869 I \n'
    '1.03.796.869 I target:\n'
    '\n'
    '1.03.796.876 I common_perf_print:    sampling time =      29.11 ms\n'
    '1.03.796.876 I common_perf_print:    samplers time =      13.60 ms /    21 tokens\n'
    '1.03.796.881 I common_perf_print:        load time =   10451.70 ms\n'
    '1.03.796.882 I common_perf_print: prompt eval time =   35888.82 ms /    79 tokens (  454.29 ms per token,     2.20 tokens per second)\n'
    '1.03.796.883 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)\n'
    '1.03.796.884 I common_perf_print:       total time =   51626.22 ms /    80 tokens\n'
    '1.03.796.885 I common_perf_print: unaccounted time =   15708.29 ms /  30.4 %      (total - sampling - prompt eval - eval) / (total)\n'
    '1.03.796.886 I common_perf_print:    graphs reused =          2\n'
)
# Recorded: llama-lookup on qwen-coder-0.5b.gguf, the same prompt.
LOOKUP_STDERR = (
    '0.07.458.275 I encoded   40 tokens in    2.412 seconds, speed:   23.631 t/s\n'
    '0.07.458.324 I decoded   17 tokens in    2.784 seconds, speed:    6.106 t/s\n'
    '0.07.458.366 I \n'
    '0.07.458.407 I n_draft      = 8\n'
    '0.07.458.447 I n_predict    = 17\n'
    '0.07.458.488 I n_drafted    = 8\n'
    '0.07.458.528 I t_draft_flat = 0.04 ms\n'
    '0.07.458.570 I t_draft      = 0.14 ms, 18.12 us per token, 55172.41 tokens per second\n'
    '0.07.458.610 I n_accept     = 4\n'
    '0.07.458.651 I accept       = 50.000%\n'
    '0.07.458.692 I \n'
    'target:\n'
    '\n'
    '0.07.458.737 I common_perf_print:    sampling time =       4.63 ms\n'
    '0.07.458.779 I common_perf_print:    samplers time =       1.55 ms /    17 tokens\n'
    '0.07.458.824 I common_perf_print:        load time =    1659.36 ms\n'
    '0.07.458.866 I common_perf_print: prompt eval time =    2412.08 ms /    49 tokens (   49.23 ms per token,    20.31 tokens per second)\n'
    '0.07.458.908 I common_perf_print:        eval time =    2151.19 ms /    11 runs   (  195.56 ms per token,     5.11 tokens per second)\n'
    '0.07.458.949 I common_perf_print:       total time =    5205.89 ms /    60 tokens\n'
    '0.07.458.991 I common_perf_print: unaccounted time =     637.98 ms /  12.3 %      (total - sampling - prompt eval - eval) / (total)\n'
    '0.07.459.032 I common_perf_print:    graphs reused =         10\n'
)
# what each says
AR_TEXT = "Here's a simple Python function that returns the square of a given number:\n\n```"
AR_COUNTS = (40, 15, 16, 16)   # prompt, decode, new, forwards
AR_DECODE_MS, AR_PREFILL_MS = 30498.36, 5426.92
SPEC_TEXT = '```python\ndef square(x):\n    """\n    Calculate the square of a given number x.\n\n    Args'
SPEC_COUNTS = (40, 21, 21, 33, 16)   # prompt, decode, new, drafted, accepted
SPEC_DECODE_MS = 37842.0
LOOKUP_COUNTS = (17, 8, 4)   # decode, drafted, accepted


def test_completion_output_gives_text_and_decode_timing():
    run = llamacpp.parse_completion(AR_STDOUT, AR_STDERR)
    assert run.text == AR_TEXT
    assert (run.prompt_tokens, run.decode_tokens, run.new_tokens, run.target_forwards) == AR_COUNTS
    assert run.decode_ms == pytest.approx(AR_DECODE_MS) and run.prefill_ms == pytest.approx(AR_PREFILL_MS)
    assert not run.eog                                               # it ran to -n
    # an end-of-generation token: llama-completion appends its marker, which is not text
    stopped = llamacpp.parse_completion("42 [end of text]\n\n\n", AR_STDERR)
    assert stopped.text == "42" and stopped.eog


def test_speculative_output_gives_text_acceptance_and_decode_timing():
    run = llamacpp.parse_speculative(SPEC_STDOUT, SPEC_STDERR, SPEC_PROMPT, 16)
    assert run.text == SPEC_TEXT
    assert (run.prompt_tokens, run.decode_tokens, run.new_tokens, run.drafted, run.accepted) == SPEC_COUNTS
    assert run.target_forwards == run.new_tokens - run.accepted
    assert run.decode_ms == pytest.approx(SPEC_DECODE_MS)
    assert not run.eog                                      # n_predict 21 > -n 16: stopped by length
    assert llamacpp.parse_speculative(SPEC_STDOUT, SPEC_STDERR, SPEC_PROMPT, 21).eog   # 21 <= 21: at an EOG
    lookup = llamacpp.parse_speculative("\n\n" + SPEC_PROMPT + "x\n\n\n\n", LOOKUP_STDERR, SPEC_PROMPT, 16)
    assert lookup.text == "x" and (lookup.decode_tokens, lookup.drafted, lookup.accepted) == LOOKUP_COUNTS


def test_unreadable_output_is_one_clear_error():
    with pytest.raises(llamacpp.LlamaCppError, match="no 'eval time' line"):
        llamacpp.parse_completion("text", "llama_perf_context_print: prompt eval time = 1.0 ms / 3 tokens")
    with pytest.raises(llamacpp.LlamaCppError, match="echoed another prompt"):
        llamacpp.parse_speculative("\n\nsomething else", SPEC_STDERR, SPEC_PROMPT, 16)


def test_commands_are_greedy_same_length_same_threads():
    exe, model, draft = Path("/b/llama-x"), Path("/m/t.gguf"), Path("/m/d.gguf")
    ar = llamacpp.command("ar", exe, model, "p\\n", 16, 2, 4096)
    spec = llamacpp.command("spec", exe, model, "p", 16, 2, 4096, draft, 8)
    lookup = llamacpp.command("lookup", exe, model, "p", 16, 2, 4096, None, 8)
    for argv in (ar, spec, lookup):
        flag = lambda name: argv[argv.index(name) + 1]  # noqa: E731
        assert flag("-n") == "16" and flag("-t") == flag("-tb") == "2"
        assert flag("--temp") == "0" and flag("--top-k") == "1" and "--no-escape" in argv
    assert ar[ar.index("-p") + 1] == "p\\n"                   # passed as is: --no-escape keeps a literal \n
    assert "-no-cnv" in ar and "--no-display-prompt" in ar   # no chat template of llama.cpp's own
    assert spec[spec.index("-md") + 1] == str(draft) and spec[spec.index("--spec-type") + 1] == "draft-simple"
    assert spec[spec.index("--spec-draft-n-max") + 1] == "8" == lookup[lookup.index("--spec-draft-n-max") + 1]


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llamacpp.py"), *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--llama", "ar,beam"], "--llama 'beam': choose from ar, spec, lookup"),
    (["--llama-draft-max", "0"], "--llama-draft-max must be >= 1"),
    (["--llama-bin", "/nonexistent", "--tiny", "--gguf", "x.gguf"], "no llama.cpp binary /nonexistent/llama-completion"),
    (["--tiny"], "--tiny has no GGUF for llama.cpp"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = _script(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


STAND_IN = """#!{python}
# a stand-in llama.cpp binary: prints the recorded output of {row} (echoing the prompt where llama.cpp does)
import json, sys
argv = sys.argv[1:]
prompt = argv[argv.index("-p") + 1]
out = json.loads({out!r})
if {echo}:
    out = "\\n\\n" + prompt + out
sys.stdout.write(out)
sys.stderr.write(json.loads({err!r}))
"""


def stand_ins(folder: Path) -> Path:
    outputs = {"ar": ("llama-completion", AR_STDOUT, AR_STDERR, False),
               "spec": ("llama-speculative-simple", SPEC_TEXT + "\n\n\n\n", SPEC_STDERR, True),
               "lookup": ("llama-lookup", SPEC_TEXT + "\n\n\n\n", LOOKUP_STDERR, True)}
    for row, (name, out, err, echo) in outputs.items():
        path = folder / name
        path.write_text(STAND_IN.format(python=sys.executable, row=row, out=json.dumps(out), err=json.dumps(err),
                                        echo=echo))
        path.chmod(0o755)
    return folder


def test_a_whole_run_interleaves_llamacpp_rows_with_ours(tmp_path):
    bins = stand_ins(tmp_path)
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "r.json"
    report = llamacpp.main(["--tiny", "--limit", "2", "--max-new-tokens", "4", "--threads", "1", "--strategies", "ar",
                            "--llama-bin", str(bins), "--gguf", str(gguf), "--llama-draft-model", str(gguf),
                            "--quiet", "--json", str(out)])
    assert json.loads(out.read_text())["schema"] == llamacpp.SCHEMA
    s = report["summary"]
    assert list(s) == ["hf_generate", "cure_ar", "llama_ar", "llama_spec", "llama_lookup"]
    assert report["environment"]["ar_dtype"] == AUTO_DTYPE
    runs = [r for r in report["results"] if r["method"] == "llama_ar"]
    assert len(runs) == 2 and all(r["decode_tokens"] == AR_COUNTS[1] for r in runs)
    assert s["llama_ar"]["tokens_per_s"] == pytest.approx(1e3 * AR_COUNTS[1] / AR_DECODE_MS)
    assert s["llama_spec"]["accept_rate"] == pytest.approx(SPEC_COUNTS[4] / SPEC_COUNTS[3])
    # tau from llama.cpp's own counts: new tokens / target forwards (each verification: accepted + 1)
    assert s["llama_ar"]["tau"] == 1.0
    assert s["llama_spec"]["tau"] == pytest.approx(SPEC_COUNTS[2] / (SPEC_COUNTS[2] - SPEC_COUNTS[4]))
    assert s["cure_ar"]["all_match_hf_greedy"]                       # ours stays lossless beside them
    # every prompt ran every method, in the balanced order
    assert {r["run_position"] for r in report["results"] if r["prompt_index"] == 0} == set(range(5))
    assert [m["lossless"] for m in report["methods"]] == [True, True, False, False, False]
