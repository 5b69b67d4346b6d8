"""rooflab's kernels: every exercise solution and playground kernel, once, tested.

Import ``rooflab.autograder`` (or ``rooflab.kernels``, which does it for you) before any
module here: on a machine without a GPU that switches Triton to its interpreter before
the first ``@triton.jit`` runs.
"""

from rooflab.autograder import device as _device

_device.enable_interpreter_if_no_gpu()
