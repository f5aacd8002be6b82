"""The compression codecs of Kafka record batches, and whether this process can read them.

A producer with ``compression.type`` set (most production producers: librdkafka, the Java
client and Kafka Connect compress with snappy, lz4 or zstd) writes record batches that a
consumer must decompress before it sees one record. aiokafka decompresses gzip with the
standard library and snappy, lz4 and zstd with ``cramjam`` (its ``snappy``, ``lz4`` and
``zstd`` extras, which stream-dp's own dependencies include): without it every fetch of
such a batch fails with ``UnsupportedCodecError``, for ever, and nothing is read.

:func:`missing_codecs` asks aiokafka itself (``aiokafka.codec.has_*``, what its record
parser checks before it decompresses), so the answer is the parser's.
"""

from __future__ import annotations

from typing import Final

from aiokafka import codec as _codec

#: The codecs of Kafka's record-batch attributes (KIP-110 added zstd), in their id order.
CODECS: Final = ("gzip", "snappy", "lz4", "zstd")
#: What installs the three that are not in the standard library.
INSTALL_HINT: Final = (
    "pip install 'cramjam>=2.8' (a dependency of stream-dp, missing from this environment; "
    "or use the container image)"
)


def missing_codecs() -> list[str]:
    """The codecs of :data:`CODECS` that this process cannot compress or decompress."""
    available = {
        "gzip": _codec.has_gzip,
        "snappy": _codec.has_snappy,
        "lz4": _codec.has_lz4,
        "zstd": _codec.has_zstd,
    }
    return [name for name in CODECS if not available[name]()]


def codecs_problem() -> str | None:
    """One line naming the codecs this process cannot read and how to fix it; None when it
    reads all four."""
    missing = missing_codecs()
    if not missing:
        return None
    return (
        f"this installation cannot decompress {', '.join(missing)}: input written by a "
        f"producer with compression.type={missing[0]} cannot be read; install the codec "
        f"library: {INSTALL_HINT}"
    )
