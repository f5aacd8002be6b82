"""``stream-dp examples DIR``: the packaged example config and sample, written where asked,
never over a user's edits unless --force."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stream_dp.cli.examples_cmd import EXAMPLE_FILES, examples_dir
from stream_dp.cli.main import main
from stream_dp.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_writes_the_packaged_files_and_keeps_edits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "new" / "folder"
    assert main(["examples", str(target)]) == 0
    for name in EXAMPLE_FILES:
        assert (target / name).read_bytes() == examples_dir().joinpath(name).read_bytes()
        assert (target / name).read_bytes() == (ROOT / "stream_dp" / "examples" / name).read_bytes()
    assert capsys.readouterr().out.count("wrote: ") == len(EXAMPLE_FILES) == 3

    assert main(["examples", str(target)]) == 0  # the same files again: nothing to do
    assert capsys.readouterr().out.count("unchanged: ") == 3

    edited = target / "browser-logs.yaml"
    edited.write_text("# my edits\n")
    assert main(["examples", str(target)]) == 2
    assert "pass --force to overwrite" in capsys.readouterr().err
    assert edited.read_text() == "# my edits\n"
    assert main(["examples", str(target), "--force"]) == 0
    assert edited.read_bytes() == examples_dir().joinpath("browser-logs.yaml").read_bytes()


def test_a_file_in_the_way_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "examples"
    blocker.write_text("")
    assert main(["examples", str(blocker)]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_live_example_has_one_minute_windows_and_plans() -> None:
    """The live example shows a window within minutes; the replay one matches the sample."""
    live = load_config(ROOT / "stream_dp" / "examples" / "browser-logs-live.yaml")
    replay = load_config(ROOT / "stream_dp" / "examples" / "browser-logs.yaml")
    assert live.window.size_s == 60 and live.window.start_at is None
    assert live.window.life_s <= 120
    assert replay.window.size_s == 3600
    assert main(["plan", "--config", str(ROOT / "stream_dp/examples/browser-logs-live.yaml")]) == 0


@pytest.mark.parametrize("name", ["browser-logs.yaml", "browser-logs-live.yaml"])
def test_the_topic_names_an_example_mentions_are_the_ones_it_resolves(name: str) -> None:
    """A comment that names the internal topics names this example's own (its group id's),
    not another example's: copied into a deployment, it is what an operator grants ACLs to."""
    path = ROOT / "stream_dp" / "examples" / name
    config = load_config(path)
    group = re.escape(config.kafka.group_id)
    mentioned = set(re.findall(rf"(?<![\w.-]){group}\.[a-z-]+", path.read_text("utf-8")))
    out = config.output
    resolved = {
        out.dead_letter_topic,
        out.ledger_topic,
        out.partials_topic,
        out.repartition_topic,
        out.continual_topic,
        out.access_log_topic,
    }
    assert mentioned == resolved
    others = re.findall(r"(?<![\w.-])stream-dp(?:-live)?\.[a-z-]+", path.read_text("utf-8"))
    assert set(others) <= resolved, sorted(set(others) - resolved)
