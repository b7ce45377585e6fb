"""Paged-attention kernels: one Jinja template per kernel, its launcher and its pure-MLX reference."""
