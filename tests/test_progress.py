"""LoggedProgress: long commands (train-drafter, bench) still report progress into a log file."""
import io

from rich.console import Console

from cure_cli.common import LoggedProgress


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
