"""``stp testset``'s test cases: re-exported from :mod:`steptp.dataset.testset`, where they
are built (issue 53: ``stp dataset --split`` builds them too, so they sit below the
evaluation; here they made the dataset and the evaluation import each other)."""

from ..dataset.testset import (FLOAT_DTYPES, OverlapError, TestsetError, Variant, build_testset,  # noqa: F401
                               dataset_programs, variants_of, with_dtype)

__all__ = ["FLOAT_DTYPES", "TestsetError", "OverlapError", "Variant", "with_dtype", "variants_of",
           "dataset_programs", "build_testset"]
