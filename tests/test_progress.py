"""LoggedProgress: long commands (train-drafter, bench) still report progress into a log file."""
import io

from rich.console import Console

from cure_cli.common import LoggedProgress

from test_embedded import make_part_packages, registry, site, write_tiny_qwen2_gguf  # noqa: F401 (fixtures)


def run(terminal: bool, every: float) -> str:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal, width=100)
    with LoggedProgress(console=console, every=every) as p:
        task = p.add_task("training", total=4, info="")
        for i in range(4):
            p.update(task, advance=1, info=f"loss {i}")
    return buf.getvalue()


def test_plain_lines_in_a_log_file():
    out = run(terminal=False, every=3600)
    lines = [x for x in out.splitlines() if x.startswith("training:")]
    # the first update, then nothing until the task completes (every=1 h), then nothing more
    assert lines[0].startswith("training: 1/4") and lines[0].endswith("loss 0")
    assert lines[1].startswith("training: 4/4") and lines[1].endswith("loss 3")
    assert len(lines) == 2


def test_no_plain_lines_on_a_terminal():
    assert "training: 1/4" not in run(terminal=True, every=0)


# ---- the core's long phases (cure_core/progress.py), shown by the CLI: one line and a bar each ----

def test_phases_cost_nothing_without_a_reporter_and_nest():
    from cure_core.progress import phase, reporting

    class Recorder:
        def __init__(self):
            self.events = []

        def start(self, name, total, unit):
            self.events.append(("start", name, total, unit))
            return name

        def update(self, handle, done, total):
            self.events.append(("update", handle, done))

        def end(self, handle):
            self.events.append(("end", handle))

    with phase("nobody listens", total=3) as update:
        update(1)                                    # a no-op
    rec = Recorder()
    with reporting(rec):
        with phase("outer", total=2, unit="bytes") as update:
            with phase("inner"):
                pass
            update(2)
    assert rec.events == [("start", "outer", 2, "bytes"), ("start", "inner", None, "steps"), ("end", "inner"),
                          ("update", "outer", 2), ("end", "outer")]
    with phase("after the block"):                   # the reporter is gone again
        pass
    assert len(rec.events) == 5


def test_a_first_run_prints_a_line_per_long_phase(site, registry, tmp_path, monkeypatch):
    """`cure generate` on an embedded alias that is installed but not converted yet: every long phase
    (locating the parts, assembling + sha256, converting, writing the cache, loading, the cost curve)
    says what it does, in one line each, before the answer streams."""
    import hashlib

    from typer.testing import CliRunner

    from cure_cli.main import app
    from cure_core.embedded import EmbeddedModel

    src = tmp_path / "tiny.gguf"
    write_tiny_qwen2_gguf(src)
    payload = src.read_bytes()
    half = len(payload) // 2
    pkgs = make_part_packages(site, "fkfirst", [payload[:half], payload[half:]])
    registry(EmbeddedModel(alias="tiny-first", hf_name="test/tiny-first", description="tiny", packages=pkgs,
                           version="1.0", size=len(payload), sha256=hashlib.sha256(payload).hexdigest(),
                           licence="test", eos_tokens=("<|im_end|>", "<|endoftext|>")))
    monkeypatch.setenv("CURE_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(app, ["generate", "def", "--target", "tiny-first", "--raw", "-n", "3"])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.endswith("…")]
    expected = ["locating the weight parts of tiny-first", "assembling tiny-first and checking its sha256",
                "converting tiny-first", "writing the cache of tiny-first", "loading tiny-first"]
    for i, start in enumerate(expected):
        assert any(x.startswith(start) for x in lines), (start, lines)
    order = [next(j for j, x in enumerate(lines) if x.startswith(s)) for s in expected]
    assert order == sorted(order)
    assert "de-quantizing GGUF tensors" not in r.stderr        # transformers' own bar counts into the phase
    # a second run finds the cache: it only loads
    r = CliRunner().invoke(app, ["generate", "def", "--target", "tiny-first", "--raw", "-n", "3"])
    assert r.exit_code == 0 and not any("converting" in x for x in r.stderr.splitlines())
    assert any(x.startswith("loading tiny-first") for x in r.stderr.splitlines())


def test_the_cost_curve_is_measured_with_a_progress_line(tmp_path):
    from typer.testing import CliRunner

    from cure_cli.main import app
    from cure_core.tiny import save_tiny_pair
    t, d = save_tiny_pair(tmp_path)
    r = CliRunner().invoke(app, ["generate", "def", "--target", str(t), "--draft", str(d), "--raw", "-n", "3"])
    assert r.exit_code == 0, r.output
    assert any(x.startswith("measuring the verification cost curve") for x in r.stderr.splitlines())
