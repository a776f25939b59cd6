"""The optional C part of rankwatch: pyproject.toml holds everything else.

Three helpers of the streaming core (pipeline/stream/native.py): ``_rowscan`` scans the usual JSON event
straight into the batch path's rows, ``_fastapply`` applies the batch path's common event, ``_labels`` matches
finalized requests' feedback to their items. They are optional: where no C compiler is found the install goes
on without them, and the Python code they replace runs instead, to the same results (docs/benchmarks.md has
what they save).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            f"rankwatch.pipeline.stream.{name}",
            [f"rankwatch/pipeline/stream/{name}.c"],
            depends=["rankwatch/pipeline/stream/_json_subset.h"],
            optional=True,  # no compiler: installed without it
            extra_compile_args=["-O2"],
        )
        for name in ("_rowscan", "_fastapply", "_labels")
    ]
)
