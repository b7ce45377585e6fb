"""Benchmarks; `mlx-paged bench ...` runs them, results/ holds the current run of each public one,
and `make bench-docs` renders docs/benchmarks.md from it."""
