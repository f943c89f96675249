"""Thinking mode (--thinking/--no-thinking): Qwen3's enable_thinking switch, its default per drafter, the
warning when a choice contradicts the drafter, and the trace header that records it."""
import json

import pytest
from typer.testing import CliRunner

from cure_core import load
from cure_core.models import encode_prompt
from cure_core.thinking import Declared, choose_thinking, declared_in_card, declared_in_config, template_has_switch
from cure_core.tiny import QWEN3_CHAT_TEMPLATE, byte_tokenizer, save_tiny_pair, tiny_target
from cure_core.trace import read_trace
from cure_cli.main import app

from test_dflash import write_dflash

EMPTY_THINK = list(b"<think>\n\n</think>\n\n")


@pytest.fixture(scope="module")
def qwen3_tok():
    return byte_tokenizer(QWEN3_CHAT_TEMPLATE)


def test_the_switch_changes_the_prompt_ids_as_the_template_defines(qwen3_tok):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    default = encode_prompt(qwen3_tok, "2+2?", True, history=history)
    on = encode_prompt(qwen3_tok, "2+2?", True, history=history, thinking=True)
    off = encode_prompt(qwen3_tok, "2+2?", True, history=history, thinking=False)
    assert default == on                        # Qwen3 thinks unless told not to
    assert off == on + EMPTY_THINK              # off: the assistant turn opens with an empty think block
    assert qwen3_tok.decode(off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # a template without the switch ignores the choice
    plain = byte_tokenizer()
    assert not template_has_switch(plain) and template_has_switch(qwen3_tok)
    assert encode_prompt(plain, "x", True, thinking=False) == encode_prompt(plain, "x", True)
    assert encode_prompt(qwen3_tok, "x", False, thinking=False) == list(b"x")     # raw text: no template


def test_declarations_in_config_and_model_card():
    assert declared_in_config({"dflash_config": {"enable_thinking": False}}).value is False
    assert declared_in_config({"thinking": True}).value is True
    assert declared_in_config({"dflash_config": {"mask_token_id": 3}}) is None
    assert declared_in_card("Use `enable_thinking=False` with the target.").value is False
    assert declared_in_card('chat_template_kwargs: {"enable_thinking": true}').value is True
    assert declared_in_card("Trained on non-thinking outputs of Qwen3-8B.").value is False
    assert declared_in_card("enable_thinking=True or enable_thinking=False both work") is None
    assert declared_in_card("A DFlash drafter for Qwen3-8B.") is None


def test_the_default_and_the_warnings():
    off = Declared(False, "its model card")
    # DFlash with no declaration: off by default; a non-DFlash drafter: the template's default
    assert choose_thinking(None, "dflash", None, True) == (False, [])
    assert choose_thinking(None, "pard", None, True) == (None, [])
    assert choose_thinking(None, "pard", Declared(True, "x"), True) == (True, [])
    # an explicit choice is kept; against the declaration it warns, in one line naming the fix
    value, warnings = choose_thinking(True, "dflash", off, True)
    assert value is True and len(warnings) == 1 and "\n" not in warnings[0]
    assert "contradicts the drafter" in warnings[0] and "its model card" in warnings[0]
    assert "`thinking`=False" in warnings[0]
    assert choose_thinking(False, "dflash", off, True) == (False, [])
    assert choose_thinking(True, "dflash", None, True)[1]               # against the DFlash default too
    assert choose_thinking(True, "pard", None, True) == (True, [])
    # no switch in the template: nothing to pass, and asking for it says so
    assert choose_thinking(None, "dflash", off, False) == (None, [])
    assert "no thinking switch" in choose_thinking(True, "dflash", None, False)[1][0]


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
    """A tiny target with a Qwen3-style template, a DFlash drafter whose model card says non-thinking,
    and a PARD drafter (no declaration)."""
    root = tmp_path_factory.mktemp("qwen3")
    target = tiny_target(seed=0)
    tdir = root / "target"
    target.save_pretrained(tdir)
    byte_tokenizer(QWEN3_CHAT_TEMPLATE).save_pretrained(tdir)
    ddir = write_dflash(root / "dflash", target)
    (ddir / "README.md").write_text("# tiny-DFlash\nServe the target with `enable_thinking=False`.\n")
    _, pard = save_tiny_pair(root / "pard")
    return tdir, ddir, pard


def test_load_resolves_thinking_per_drafter(qwen3_dirs):
    tdir, ddir, pard = qwen3_dirs
    dflash = load(target=str(tdir), draft=str(ddir))
    assert dflash.thinking is False and dflash.warnings == ()
    assert dflash.encode("hi") == encode_prompt(dflash.tokenizer, "hi", True, thinking=False)
    forced = load(target=str(tdir), draft=str(ddir), thinking=True)
    assert forced.thinking is True and len(forced.warnings) == 1
    assert forced.encode("hi") != dflash.encode("hi")
    assert load(target=str(tdir), draft=str(pard)).thinking is None    # the template's default


def test_generate_warns_and_the_trace_records_the_choice(qwen3_dirs, tmp_path):
    tdir, ddir, _ = qwen3_dirs
    trace = tmp_path / "t.jsonl"
    r = CliRunner().invoke(app, ["generate", "2+2?", "--target", str(tdir), "--draft", str(ddir), "-n", "4",
                                 "--thinking", "--trace", str(trace)])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if "warning:" in x]
    assert len(lines) == 1 and "--no-thinking matches it" in lines[0]
    header = read_trace(trace).header
    assert header["thinking"] is True
    r = CliRunner().invoke(app, ["generate", "2+2?", "--target", str(tdir), "--draft", str(ddir), "-n", "4",
                                 "--trace", str(trace)])
    assert r.exit_code == 0 and "warning:" not in r.stderr
    assert read_trace(trace).header["thinking"] is False
    assert json.loads(trace.read_text().splitlines()[1])["prompt_ids"][-len(EMPTY_THINK):] == EMPTY_THINK


def test_the_switch_is_on_generate_chat_and_bench():
    for command in ("generate", "chat", "bench"):
        r = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert "--thinking" in r.output and "--no-thinking" in r.output, command
