"""HIR pipeline: Hierarchical Interest Representation as Spark batch jobs."""

from setuptools import find_packages, setup

setup(
    name="hir-pipeline",
    version="0.1.0",
    description="Hierarchical Interest Representation: Spark + Delta + PyTorch feature pipeline",
    python_requires=">=3.11,<3.12",
    packages=find_packages(
        include=["jobs", "jobs.*", "hir_model", "hir_model.*", "udfs", "udfs.*", "schemas", "schemas.*"]
    ),
    # Exact pins live in requirements.txt (make setup installs them); these are the compatible ranges.
    install_requires=[
        "pyspark>=4.0,<4.1",
        "delta-spark>=4.4,<4.5",
        "pyarrow>=14,<15",
        "numpy>=1.26,<2",
        "pandas>=2.2,<3",
    ],
    entry_points={"console_scripts": ["hir=jobs.cli:main"]},
)
