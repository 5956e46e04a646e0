"""The emulators of the GPU kernels (test tooling, not installed): ``emu_build`` / ``metal_build``
compile the CUDA / Metal kernels with g++ over the host shims (tests/shim) and import the module,
``cuda_ops`` / ``metal_ops`` run its kernels with the reference's arguments.

A package so that the tests (``tests/`` is on their path) and ``bench/traffic.py`` (which imports
it by location, see its ``emu_build``) use it without putting ``tests/emu`` on ``sys.path``.
"""
