"""Kept for tools that look for a setup.py; the package metadata lives in pyproject.toml."""

from setuptools import setup

setup()
