"""The course's problems, one module per lab. Importing this package registers them."""

from . import coalescing, matmul, roofline  # noqa: F401
