"""Puts imagenet_class.tsv beside the module in the wheel: setuptools ships package data for
packages only, and this project is one module (``python imagenet_classification.py`` runs it)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class _BuildPyWithClassTable(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file("imagenet_class.tsv", str(Path(self.build_lib, "imagenet_class.tsv")))


setup(cmdclass={"build_py": _BuildPyWithClassTable})
