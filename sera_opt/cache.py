"""The compiled-kernel cache: where numba keeps sera_opt's kernels, what is in it, and the
background compile of the largest one.

``sera-opt cache [info|clear]`` is the command-line form of :func:`kernel_cache_info` and
:func:`clear_kernel_cache`; docs/api.md ("Compiled kernels and their cache") says how the directory is
chosen and when a kernel compiles.
"""

#: The environment variable that, set to ``0`` (or ``false``, ``no``, ``off``), compiles every
#: kernel in the calling process on the call that first needs it, instead of in the background.
from ._background import ENV_VAR as BACKGROUND_COMPILE_ENV
from ._background import wait_for_kernels
from ._kernel_cache import (
    KernelCacheInfo,
    clear_kernel_cache,
    kernel_cache_info,
    set_kernel_cache_dir,
)

__all__ = [
    "BACKGROUND_COMPILE_ENV",
    "KernelCacheInfo",
    "clear_kernel_cache",
    "kernel_cache_info",
    "set_kernel_cache_dir",
    "wait_for_kernels",
]
