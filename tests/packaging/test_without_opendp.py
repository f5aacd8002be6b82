"""OpenDP is optional (the ``gaussian`` extra): the default install draws discrete Laplace
noise with stream-dp's own exact sampler, and a configuration that needs OpenDP is refused
at load with what to install — never a crash in the middle of a release.

Each check runs in a fresh interpreter where ``import opendp`` fails, as on a machine that
installed ``stream-dp`` without the extra.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stream_dp.privacy.mechanisms import OPENDP_EXTRA

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "stream_dp" / "examples"
#: Makes ``import opendp`` (and any submodule) raise ImportError in the child.
WITHOUT_OPENDP = "import sys\nsys.modules['opendp'] = None\nsys.modules['opendp.prelude'] = None\n"


def _run_without_opendp(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_OPENDP + textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_default_example_replays_without_opendp(tmp_path: Path) -> None:
    done = _run_without_opendp(
        f"""
        from stream_dp.cli.main import main
        code = main(["replay", "--config", {str(EXAMPLES / "browser-logs.yaml")!r},
                     "--input", {str(EXAMPLES / "sample-events.jsonl")!r}])
        assert "opendp" not in sys.modules or sys.modules["opendp"] is None
        sys.exit(code)
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "replay printed no released window"


def test_discrete_laplace_draws_without_opendp_and_gaussian_says_what_to_install(
    tmp_path: Path,
) -> None:
    done = _run_without_opendp(
        """
        from stream_dp.errors import ConfigError
        from stream_dp.privacy.mechanisms import DiscreteGaussian, DiscreteLaplace
        noisy = DiscreteLaplace(2.0).sample([100] * 10_000)
        assert len(noisy) == 10_000 and len(set(noisy)) > 5
        try:
            DiscreteGaussian(3.0)
        except ConfigError as exc:
            print("REFUSED:", exc)
        else:
            raise SystemExit("a discrete Gaussian was built without OpenDP")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED:" in done.stdout
    assert OPENDP_EXTRA in done.stdout
    assert "discrete_laplace" in done.stdout  # the other way out


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"mechanism": "discrete_gaussian", "delta": 1e-9}, "discrete_gaussian"),
        ({"selection": "weighted_gaussian"}, "weighted_gaussian"),
    ],
)
def test_a_configuration_that_needs_opendp_is_refused_at_load_with_the_install_line(
    tmp_path: Path, edit: dict[str, object], named: str
) -> None:
    done = _run_without_opendp(
        f"""
        import yaml
        from stream_dp.config.loader import load_config
        from stream_dp.errors import ConfigError
        doc = yaml.safe_load(open({str(EXAMPLES / "browser-logs.yaml")!r}))
        for query in doc["queries"]:
            query.update({edit!r})
        with open("needs-opendp.yaml", "w") as f:
            yaml.safe_dump(doc, f)
        try:
            load_config("needs-opendp.yaml")
        except ConfigError as exc:
            print("REFUSED:", exc)
        else:
            raise SystemExit("loaded a configuration that needs OpenDP without it")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED:" in done.stdout
    assert OPENDP_EXTRA in done.stdout
    assert named in done.stdout
