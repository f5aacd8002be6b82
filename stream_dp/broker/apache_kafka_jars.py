"""The jars of the Apache Kafka broker the test tier, the bench and the chaos run start.

One pinned version (:data:`APACHE_KAFKA_VERSION`), fetched from Maven Central by Maven with
the project's ``ops/apache-kafka/pom.xml`` (``mvn dependency:copy-dependencies``) into
``.venv/apache-kafka-VERSION/libs`` and kept there. ``make kafka-jars`` (a step of ``make
test``) runs :func:`fetch_jars`; so does ``python -m stream_dp.broker.apache_kafka_jars``.
Several processes may ask at once (pytest-xdist workers): a file lock lets one fetch, and the
folder appears whole or not at all (copied to a temporary folder, then renamed).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stream_dp.errors import BrokerError

#: The Apache Kafka version of the tier: the same in ops/apache-kafka/pom.xml and in
#: docker-compose.yml's ``apache/kafka`` image (tests/apache_kafka checks both). Kafka 4.x
#: brokers need Java 17 or newer.
APACHE_KAFKA_VERSION = "4.1.1"
#: Where the jars go unless ``STREAM_DP_APACHE_KAFKA_LIBS`` names another folder.
LIBS_ENV = "STREAM_DP_APACHE_KAFKA_LIBS"
#: The Java runtime used unless ``JAVA_HOME`` is set (then ``$JAVA_HOME/bin/java``).
JAVA_MIN_MAJOR = 17
_REPO_ROOT = Path(__file__).resolve().parents[2]
_POM = _REPO_ROOT / "ops" / "apache-kafka" / "pom.xml"
_FETCH_TIMEOUT_S = 900.0
#: A jar whose presence says the copy is complete (the broker's main class lives in it).
_MAIN_JAR = f"kafka_2.13-{APACHE_KAFKA_VERSION}.jar"


class JarsMissing(BrokerError):
    """The broker's jars are not there and cannot be fetched here (no Maven)."""

    retriable = False


def default_libs_dir() -> Path:
    """``$STREAM_DP_APACHE_KAFKA_LIBS``, else ``<repo>/.venv/apache-kafka-VERSION/libs``."""
    override = os.environ.get(LIBS_ENV)
    if override:
        return Path(override)
    return _REPO_ROOT / ".venv" / f"apache-kafka-{APACHE_KAFKA_VERSION}" / "libs"


def jars_present(libs_dir: Path) -> bool:
    return (libs_dir / _MAIN_JAR).is_file()


def java_executable() -> str | None:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else ``java`` on PATH; None if neither."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major_version(java: str) -> int:
    """The feature release of ``java`` (17 for "17.0.15"); BrokerError if it cannot be run."""
    try:
        probe = subprocess.run(  # noqa: S603 - a fixed argv
            [java, "-XshowSettings:properties", "-version"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"cannot run {java} -version: {exc}") from None
    for line in probe.stderr.splitlines():
        key, _, value = line.strip().partition(" = ")
        if key == "java.specification.version":
            return int(value.split(".")[-1] if value.startswith("1.") else value.split(".")[0])
    raise BrokerError(f"{java} -version did not say its version: {probe.stderr[-400:]}")


def fetch_jars(libs_dir: Path | None = None, *, mvn: str | None = None) -> Path:
    """The folder of the broker's jars, fetched with Maven first when missing.

    JarsMissing (saying what to install) when they are missing and Maven is not on PATH;
    BrokerError with Maven's last output when Maven fails.
    """
    target = libs_dir or default_libs_dir()
    if jars_present(target):
        return target
    maven = mvn or shutil.which("mvn")
    if maven is None:
        raise JarsMissing(
            f"the Apache Kafka {APACHE_KAFKA_VERSION} jars are not in {target} and Maven "
            "(mvn) is not on PATH to fetch them: install Maven and Java 17+ "
            "(Debian: apt-get install maven openjdk-17-jre-headless) and run `make kafka-jars`, "
            f"or set {LIBS_ENV} to a folder holding the jars of Apache Kafka's libs/"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".fetch.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others wait, then reuse
        if not jars_present(target):
            _copy_dependencies(maven, target)
    return target


def _copy_dependencies(maven: str, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=target.parent))
    argv = [maven, "-B", "-q", "-f", str(_POM), "dependency:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
            f"-Dkafka.version={APACHE_KAFKA_VERSION}"]  # fmt: skip
    try:
        done = subprocess.run(  # noqa: S603 - a fixed argv
            argv, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S, check=False
        )
        if done.returncode != 0 or not jars_present(staging):
            raise BrokerError(
                f"fetching the Apache Kafka {APACHE_KAFKA_VERSION} jars from Maven Central "
                f"failed (mvn exit {done.returncode}); its last output:\n"
                f"{(done.stdout + done.stderr)[-2000:]}"
            )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except subprocess.TimeoutExpired:
        raise BrokerError(
            f"fetching the Apache Kafka jars took over {_FETCH_TIMEOUT_S:g} s; is Maven "
            "Central reachable?"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main() -> int:
    """``python -m stream_dp.broker.apache_kafka_jars``: fetch the jars, print their folder."""
    try:
        print(fetch_jars())
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
