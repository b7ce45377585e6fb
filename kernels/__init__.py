"""Paged-attention kernels: Jinja templates, their specs, routing and launcher, and the
pure-MLX reference."""
