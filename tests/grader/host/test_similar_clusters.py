"""The summary's *Similar to a classmate*: clusters of similar work, not a line per student.

The clusters are checked against an independent breadth-first search over random graphs;
the summary against a class of three clusters (a chain of three, a pair, a star of 14).
"""

import io
import random
from types import SimpleNamespace

import pytest

from autograder.core.limits import Limits
from autograder.core.results import StudentResult
from autograder.host import summary


def components(pairs):
    """Connected components of the graph of ``pairs`` by breadth-first search."""
    graph = {}
    for a, b, _, _ in pairs:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set()).add(a)
    seen, out = set(), []
    for start in sorted(graph):
        if start in seen:
            continue
        todo, group = [start], set()
        while todo:
            x = todo.pop()
            if x not in group:
                group.add(x)
                todo.extend(graph[x] - group)
        seen |= group
        out.append(frozenset(group))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_clusters_are_the_connected_groups_of_the_pairs(seed):
    rng = random.Random(seed)
    students = [f"s{i}" for i in range(rng.randint(2, 40))]
    pairs = sorted({(*sorted(rng.sample(students, 2)), rng.choice(["f", "g"]), rng.uniform(0.9, 1.0))
                    for _ in range(rng.randint(1, 30))})
    clusters = summary.similar_clusters(pairs)
    assert {frozenset(c) for c, _ in clusters} == set(components(pairs))
    assert [len(c) for c, _ in clusters] == sorted((len(c) for c, _ in clusters), reverse=True)
    for students_, functions in clusters:   # each pair counted once, in its own cluster
        mine = [p for p in pairs if p[0] in students_]
        assert sum(n for _, n, _ in functions) == len(mine)
        assert {f: top for f, _, top in functions} == {
            f: max(p[3] for p in mine if p[2] == f) for f in {p[2] for p in mine}}


def test_the_summary_lists_clusters_and_only_their_students():
    chain = [("ada", "bob", "apply_rope", 0.97), ("bob", "cy", "apply_rope", 0.93),
             ("ada", "bob", "rope_inv_freq", 0.91)]
    pair = [("dan", "eve", "causal_mask", 1.0)]
    star = [("hub", f"m{i:02}", "softmax", 0.95) for i in range(13)]
    results = [StudentResult(student=s, score=1.0, max_score=2.0, similar=["(this run's own)"])
               for s in ("ada", "bob", "cy", "dan", "eve", "hub", "zed")]
    out = io.StringIO()
    settings = SimpleNamespace(limits=Limits(), course=SimpleNamespace(policy=lambda a: "none"),
                               root="/course", sandboxed=False)
    summary.print_summary("a1", results, [], 1.0, 1, settings, out=out, similar=chain + pair + star)
    text = out.getvalue()
    block = text.split("Similar to a classmate")[1].splitlines()
    assert block[0] == (" (check by hand; each pair in grades.csv's similar column): "
                        "3 cluster(s) of 19 students")
    assert block[1:4] == [
        "  14 students: hub, m00, m01, m02, m03, m04, m05, m06, m07, m08, m09, m10 and 2 more: "
        "softmax (13 pairs, up to 95%)",
        "  3 students: ada, bob, cy: apply_rope (2 pairs, up to 97%), rope_inv_freq (91%)",
        "  2 students: dan, eve: causal_mask (100%)"]
    assert "zed" not in text and "(this run's own)" not in text   # no line per student


def test_no_pairs_no_section_and_more_than_ten_clusters_are_counted():
    settings = SimpleNamespace(limits=Limits(), course=SimpleNamespace(policy=lambda a: "none"),
                               root="/course", sandboxed=False)
    results = [StudentResult(student="ada", score=1.0, max_score=2.0)]
    out = io.StringIO()
    summary.print_summary("a1", results, [], 1.0, 1, settings, out=out, similar=[])
    assert "Similar" not in out.getvalue()
    pairs = [(f"a{i:02}", f"b{i:02}", "f", 0.9) for i in range(summary.CLUSTERS_SHOWN + 3)]
    out = io.StringIO()
    summary.print_summary("a1", results, [], 1.0, 1, settings, out=out, similar=pairs)
    lines = out.getvalue().split("Similar to a classmate")[1].splitlines()
    assert sum(line.startswith("  2 students: ") for line in lines) == summary.CLUSTERS_SHOWN
    assert "  and 3 more cluster(s)" in lines


def test_a_cluster_line_shows_ids_and_function_names_as_text():
    line = summary.cluster_line(["ada\x1b[2J", "bo\u202eb"], [("f\rg", 1, 0.95)])
    assert line == "2 students: ada\\x1b[2J, bo\\u202eb: f\\x0dg (95%)"
