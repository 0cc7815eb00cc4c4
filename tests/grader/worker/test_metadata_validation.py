"""nbgrader's cell-metadata check, with one validator per schema (the worker's speed-up), gives
the verdicts of ``jsonschema.validate``: the same cells pass and the same error is raised."""

import copy
import time
from pathlib import Path

import jsonschema
import nbformat
import pytest
from nbgrader.nbgraderformat import ValidationError
from nbgrader.nbgraderformat import common
from nbgrader.nbgraderformat.v3 import MetadataValidatorV3
from nbgrader.preprocessors import CheckCellMetadata

from autograder.worker.pipeline import _SchemaValidators, validate_metadata_once_per_schema

SOURCE = Path(__file__).resolve().parents[3] / "solutions" / "01-rope" / "01-rope.ipynb"

BROKEN = [  # (key, value) that make a cell's nbgrader metadata invalid
    ("points", "x"), ("grade", "yes"), ("grade_id", 3), ("schema_version", "3"),
    ("locked", None), ("solution", [])]


@pytest.fixture(scope="module")
def graded_cell_metadata():
    nb = nbformat.read(SOURCE, as_version=4)
    return [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]


def verdict(validate, instance, schema):
    try:
        validate(instance, schema)
    except jsonschema.ValidationError as error:
        return (error.message, list(error.path), list(error.schema_path))
    return None


def test_same_verdicts_as_jsonschema(graded_cell_metadata):
    schema = MetadataValidatorV3().schema
    cached = _SchemaValidators()
    cases = list(graded_cell_metadata)
    for meta in graded_cell_metadata[:3]:
        for key, value in BROKEN:
            broken = copy.deepcopy(dict(meta))
            broken[key] = value
            cases.append(broken)
        cases.append({k: v for k, v in meta.items() if k != "grade_id"})
    verdicts = [verdict(cached.validate, c, schema) for c in cases]
    assert verdicts == [verdict(jsonschema.validate, c, schema) for c in cases]
    honest = len(graded_cell_metadata)
    assert all(v is None for v in verdicts[:honest])
    assert sum(v is not None for v in verdicts[honest:]) >= len(BROKEN) * 3  # most are refused
    assert len(cached.validators) == 1


def test_check_cell_metadata_still_refuses_bad_metadata():
    validate_metadata_once_per_schema()
    validate_metadata_once_per_schema()  # idempotent: one cache per process
    assert isinstance(common.jsonschema, _SchemaValidators)
    nb = nbformat.read(SOURCE, as_version=4)
    CheckCellMetadata().preprocess(copy.deepcopy(nb), {})
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    cell.metadata["nbgrader"]["points"] = "many"
    with pytest.raises(ValidationError):
        CheckCellMetadata().preprocess(nb, {})


def test_a_notebook_is_checked_in_a_fraction_of_the_time(graded_cell_metadata):
    """The reason for it: jsonschema.validate checks the schema and builds a validator per cell."""
    schema, cached = MetadataValidatorV3().schema, _SchemaValidators()

    def seconds(validate):
        start = time.process_time()
        for _ in range(5):
            for meta in graded_cell_metadata:
                validate(meta, schema)
        return time.process_time() - start

    seconds(cached.validate)
    assert seconds(cached.validate) * 3 < seconds(jsonschema.validate)
