"""`python -m mutation.run ARGS`: mutmut's command line, made to work with pytest 9.

mutmut 3.7 (the newest that installs beside faust-streaming's ``click<8.4``) records which
test reached which function through ``item._nodeid``, a private attribute pytest 9 no longer
has; without it the stats run fails on the first test. This gives pytest's items the
attribute back as an alias of the public ``nodeid`` and then runs mutmut unchanged.
"""

from __future__ import annotations

import os
import sys
import threading

from _pytest.nodes import Node


def _node_id(node: Node) -> str:
    return node.nodeid


def _fresh_noise_pool() -> None:
    """In a forked child: forget the parent's noise thread pool (its threads do not exist
    in the child, so a task handed to it would wait for ever); the child makes its own."""
    mechanisms = sys.modules.get("stream_dp.privacy.mechanisms")
    if mechanisms is not None:
        mechanisms._executor = None  # type: ignore[attr-defined]
        mechanisms._executor_lock = threading.Lock()  # type: ignore[attr-defined]


def _forget_cached_results() -> None:
    """In a forked child: empty every ``functools`` cache of stream-dp's modules.

    The parent has run the clean tests, so a cached function (``false_refusal_bound``, the
    factorisations of ``privacy.continual``) would hand the child the result the unmutated
    code computed, and a mutant of a helper it calls would never run: it would survive
    every test however good. Emptying a cache changes no result, only when it is computed.
    """
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("stream_dp"):
            continue
        for value in list(vars(module).values()):
            clear = getattr(value, "cache_clear", None)
            if callable(clear):
                clear()


def make_forks_safe() -> None:
    """mutmut (and mutation.bites) fork a child per mutant from a process that has run
    tests: reset, in each child, the state that does not survive a fork or that would
    answer for the unmutated code."""
    os.register_at_fork(after_in_child=_fresh_noise_pool)
    os.register_at_fork(after_in_child=_forget_cached_results)


def patch_pytest() -> None:
    """Give pytest's nodes the ``_nodeid`` mutmut 3.7 reads."""
    if not hasattr(Node, "_nodeid"):
        Node._nodeid = property(_node_id)  # type: ignore[attr-defined]


def main() -> None:
    patch_pytest()
    make_forks_safe()
    from mutmut.__main__ import cli

    cli()


if __name__ == "__main__":
    main()
