"""Model preparation and loading: the embedded SmolLM2 default and any mlx-lm model."""
