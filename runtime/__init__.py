"""mlx-paged: a paged-attention LLM serving runtime on MLX."""

__version__ = "0.1.0"

from mlx_paged.cuda_graphs import lift_graph_input_budget  # noqa: E402

lift_graph_input_budget()  # before anything of ours runs GPU work

from mlx_paged.engine.async_llm import AsyncLLM  # noqa: E402
from mlx_paged.engine.completion import (  # noqa: E402
    CompletionDelta,
    CompletionResult,
    GenerationError,
)
from mlx_paged.engine.llm import LLM  # noqa: E402
from mlx_paged.sampling.sampling_params import SamplingParams  # noqa: E402

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionDelta",
    "CompletionResult",
    "GenerationError",
    "SamplingParams",
    "__version__",
]
