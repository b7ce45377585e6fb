"""Kernel code generation, knowing no kernel: the Jinja environment, the backend dialects
(metal | cuda), render-time checks and compilation, and compile checks without the GPU."""
