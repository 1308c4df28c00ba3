"""In a pipe rich assumes an 80-column terminal: the CLI's lines must not be broken there, so ids, ARNs and paths
stay whole for grep and copy (render.console: soft wrap). No wide-console fixture here: the width is rich's own."""

from __future__ import annotations

from click.testing import CliRunner

from review_local.cli import Ctx, cli, render

from ...texts import TEXT
from ..fakes import FakeWorld


def test_a_long_path_printed_in_a_pipe_stays_on_one_line(tmp_path):
    world = FakeWorld()
    assert render.console.width == 80 and not render.console.is_terminal  # what rich assumes in a pipe
    deep = tmp_path / ("contracts-" + "x" * 60) / ("a-very-long-contract-name-" + "y" * 60 + ".txt")
    deep.parent.mkdir()
    deep.write_text(TEXT, encoding="utf-8")
    result = CliRunner().invoke(cli, ["submit", str(deep)], obj=Ctx(None, None, deps=world.deps))
    assert result.exit_code == 0, result.output
    [line] = [x for x in result.stdout.splitlines() if x.strip()]
    assert line.startswith("job-") and line.endswith(str(deep)) and len(line) > 80
