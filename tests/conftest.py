"""Shared test set-up. Importing the autograder first switches Triton to its interpreter on
a machine without a GPU, before any test module defines a kernel."""

import pytest
import torch

import rooflab.autograder  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
