"""Benchmarks; `mlx-paged bench ...` runs them and results/ holds committed runs."""
