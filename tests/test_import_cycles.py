"""No import cycle among stream_dp's modules: each module can be read, tested and replaced
from the ones it imports, and an import-time error names one module, not a loop. Imports
under ``TYPE_CHECKING`` count (grimp's graph, the one import-linter checks): a cycle hidden
from the interpreter is still one for the reader."""

from __future__ import annotations

import grimp


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle_and_nothing_else() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_stream_dp_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("stream_dp", cache_dir=None)
    edges = {
        m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("stream_dp.")}
        for m in graph.modules
    }
    assert _cycles(edges) == []
