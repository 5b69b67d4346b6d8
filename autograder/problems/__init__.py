"""The course's problems, one module per lab. Importing this package registers them."""

from . import attention, coalescing, matmul, roofline, softmax  # noqa: F401
