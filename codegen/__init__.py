"""Kernel code generation: Jinja environment, backend dialects (metal | cuda), KernelSpec."""
