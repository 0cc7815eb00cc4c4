"""Which notebook belongs to an assignment: the release's solution cells and the names
expected in each.

:func:`solution_cells` lists a release's solution code cells, each a :class:`SolutionCell`
expecting names: those its stub defines and those its test cells read that nothing in the
release binds and Python does not provide (the ``ANSWER_...`` variables). A notebook
**belongs** to the assignment by its content, not its name (:func:`belongs_by_grade_ids`): it
holds at least half of the release's solution cells, each recognised by its nbgrader
``grade_id``, its cell type and, for a code cell, by defining one of the names expected there
(grade_ids alone repeat from one assignment to the next). A notebook whose metadata is gone
still belongs when a code cell defines one of those names (:func:`defines_expected_name`).
Code that does not parse defines nothing.
"""

import ast
import builtins
import functools
from dataclasses import dataclass

from .cells import grade_id, is_solution, is_test_cell

# a module-level name bound inside these is not bound at module level
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
          ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class SolutionCell:
    """A release solution code cell: its index and the names the student defines there."""

    index: int
    names: frozenset[str]


def parse(source):
    """The module ``source`` parses to, or None."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None


def module_names(tree):
    """Names a parsed cell binds at module level (definitions, assignments, imports)."""
    names, todo = set(), list(tree.body) if tree is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        if not isinstance(node, SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return names


def all_bound_names(tree):
    """Every name a parsed cell binds in any scope (arguments and loop variables too)."""
    names = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def used_names(tree):
    """Every name a parsed cell reads."""
    if tree is None:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@functools.lru_cache(maxsize=4096)  # a cell is matched against every release part
def defined(source):
    """Names the code ``source`` binds at module level (none if it does not parse)."""
    return frozenset(module_names(parse(source)))


def solution_cells(release):
    """The release's solution code cells, each with the names expected there.

    A cell expects what its stub defines and what its test cells (up to the next
    solution cell) read that no release cell binds and Python does not provide.
    """
    code = [(index, cell) for index, cell in enumerate(release.cells) if cell.cell_type == "code"]
    trees = {index: parse(cell.source) for index, cell in code}
    known = set(dir(builtins)).union(*(all_bound_names(tree) for tree in trees.values()))
    groups = []
    for index, cell in code:
        if is_solution(cell):
            groups.append((index, module_names(trees[index])))
        elif groups and is_test_cell(cell):
            groups[-1][1].update(used_names(trees[index]) - known)
    return [SolutionCell(index, frozenset(names)) for index, names in groups]


def belongs_by_grade_ids(notebook, release, parts):
    """Whether ``notebook`` holds at least half of the release's solution cells.

    A cell counts when it has the release cell's grade_id and type and, for a code
    cell, defines one of the names expected there (when the stub still stands, the
    stub's own name).
    """
    expected = {part.index: part.names for part in parts}
    wanted = [(index, cell) for index, cell in enumerate(release.cells)
              if is_solution(cell)]

    def present(index, cell):
        return any(grade_id(mine) == grade_id(cell) and mine.cell_type == cell.cell_type
                   and (not expected.get(index) or expected[index] & defined(mine.source))
                   for mine in notebook.cells)

    shared = sum(present(index, cell) for index, cell in wanted)
    return bool(wanted) and 2 * shared >= len(wanted)


def defines_expected_name(notebook, parts):
    """Whether a code cell of ``notebook`` defines a name some release part expects."""
    expected = set().union(*(part.names for part in parts))
    return any(expected & defined(cell.source) for cell in notebook.cells
               if cell.cell_type == "code")
