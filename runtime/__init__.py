"""mlx-paged: a paged-attention LLM serving runtime on MLX."""

__version__ = "0.1.0"

from mlx_paged.engine.llm import LLM, CompletionResult  # noqa: E402
from mlx_paged.sampling.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "CompletionResult", "SamplingParams", "__version__"]
