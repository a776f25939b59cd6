"""The optional C part of rankwatch: pyproject.toml holds everything else.

``rankwatch.pipeline.stream._rowscan`` scans the usual JSON event straight into the batch path's rows
(pipeline/stream/_rowscan.c). It is optional: where no C compiler is found the install goes on without it, and
pipeline/stream/prepare.py makes every row with msgspec, as it does for any line the scanner leaves
(docs/benchmarks.md has what it saves).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rankwatch.pipeline.stream._rowscan",
            ["rankwatch/pipeline/stream/_rowscan.c"],
            optional=True,  # no compiler: installed without it
            extra_compile_args=["-O2"],
        )
    ]
)
