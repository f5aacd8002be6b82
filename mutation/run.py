"""`python -m mutation.run ARGS`: mutmut's command line, made to work with pytest 9.

mutmut 3.7 (the newest that installs beside faust-streaming's ``click<8.4``) records which
test reached which function through ``item._nodeid``, a private attribute pytest 9 no longer
has; without it the stats run fails on the first test. This gives pytest's items the
attribute back as an alias of the public ``nodeid`` and then runs mutmut unchanged.
"""

from __future__ import annotations

from _pytest.nodes import Node


def _node_id(node: Node) -> str:
    return node.nodeid


def patch_pytest() -> None:
    """Give pytest's nodes the ``_nodeid`` mutmut 3.7 reads."""
    if not hasattr(Node, "_nodeid"):
        Node._nodeid = property(_node_id)  # type: ignore[attr-defined]


def main() -> None:
    patch_pytest()
    from mutmut.__main__ import cli

    cli()


if __name__ == "__main__":
    main()
