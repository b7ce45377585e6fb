"""Paged KV caches as mlx-lm models see them.

One `PagedKVPool` holds every layer's pages `[num_blocks, block_size, num_kv_heads, head_dim]`
(token-major, "NHD"; heads and head size may differ between layers): a K and a V array a layer
(`KVPages`, stored flat as `[num_blocks * block_size, heads, head_dim]`), or on quantized pages
one array whose rows hold both (`QuantizedKVPages`). For each forward, the runner builds a
`PagedAttentionMetadata` (block tables, lengths, positions, slot mapping) and hands the model
one `PagedLayerCache` per layer. The cache writes new K/V into the pool by scatter at
`slot_mapping`, returns only the new K/V, and the patched attention (`attention_hook.py`) reads
the pages through the block tables.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import mlx.core as mx

from mlx_paged.kernels.counter_chain import CounterChain
from mlx_paged.kernels.quantized_pages import QuantizedKVPages, QuantizedPages
from mlx_paged.kv.chunk_batch import ChunkBatch
from mlx_paged.kv.kv_groups import KVCacheGroups
from mlx_paged.kv.page_arrays import KVPages, SlotMapping
from mlx_paged.kv.rope_fusion import DeferredOffset


@dataclass
class PagedAttentionMetadata:
    """Where one forward's tokens sit in the pool. Shapes: B rows, L query tokens per row.

    Attributes:
        block_tables: `(B, max_blocks)` int32, padded with the null block 0.
        context_lens: `(B,)` int32 tokens per row after this forward's writes.
        offsets: `(B,)` int32 position of each row's first query token (RoPE offset).
        slot_mapping: where each query token's K/V is written (`SlotMapping`); padding goes to
            slot 0 of the null block.
        rope_in_attention: a decode step whose RoPE the attention kernel applies
            (`rope_fusion.py`): the model gets a `DeferredOffset`, and the attention hook writes
            the rotated keys.
        prefill_rows: per row of a prefill forward, (first position, tokens, the row's block
            table trimmed to its blocks): what lets attention read each row's exact context.
        decode_rows: a decode forward that also runs prefill chunks: the metadata of its
            decode rows alone, which come first (`block_tables`, `context_lens` are theirs);
            each further row is one token of a `prefill_rows` chunk, in order.
        chunk_batch: those chunks laid out for one attention call (`kv/chunk_batch.py`), where
            there are several.
    """

    block_tables: mx.array
    context_lens: mx.array
    offsets: mx.array
    slot_mapping: SlotMapping
    num_query_tokens: int
    rope_in_attention: bool = False
    prefill_rows: tuple[tuple[int, int, mx.array], ...] = ()
    decode_rows: PagedAttentionMetadata | None = None
    chunk_batch: ChunkBatch | None = None

    @property
    def starts_at_zero(self) -> bool:
        """Every row of a prefill forward starts at position 0 (a prompt's first chunk with no
        prefix-cache hit), so its attention needs only this forward's K/V."""
        mixed = self.decode_rows is not None
        return not mixed and bool(self.prefill_rows) and not any(s for s, _, _ in self.prefill_rows)

    @property
    def query_positions(self) -> mx.array:
        return self.offsets[:, None] + mx.arange(self.num_query_tokens)[None, :]


class PagedKVPool:
    """Every page array (`pages[layer_array[layer]]`: `KVPages` or `QuantizedKVPages`). It
    holds the only references to them, so the scatters that write new tokens can reuse (donate)
    the buffers instead of copying the pool."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype=mx.float32,
        k_bits: int = 16,
        v_bits: int = 16,
        group_size: int = 64,
        layer_shapes: list[tuple[int, int, int]] | None = None,
        groups: KVCacheGroups | None = None,
    ):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.page_shape, self.dtype = shape, dtype
        # Per layer, its KV cache group and the page array it keeps its K/V in: its own, or one
        # it shares with the layers at its place in the other groups (`kv_groups.py`).
        self.groups = groups or KVCacheGroups.single(num_layers)
        self.layer_array = list(self.groups.layer_array)
        # Per array, its K page shape and its V head size: `layer_shapes` gives (KV heads, K head
        # size, V head size) where layers differ (Gemma 4's global layers) or V heads differ
        # from K heads; a block id addresses the same tokens in each.
        shapes = layer_shapes or [(num_kv_heads, head_dim, head_dim)] * num_layers
        arrays = [shapes[layer] for layer in self.groups.array_layers]
        self.page_shapes = [(num_blocks, block_size, h, k) for h, k, _ in arrays]
        self.value_dims = [v for _, _, v in arrays]
        self.max_kv_heads = max(h for h, _, _ in shapes)
        self.layer_views = self._layer_views(shapes)
        # K and V bits per value (16: the model's dtype), quantized in groups of `group_size`.
        self.k_bits, self.v_bits, self.group_size = k_bits, v_bits, group_size
        # Set by the paged setup: "metal"/"cuda" when decode runs the generated kernel.
        self.decode_backend: str | None = None
        # Set by the paged setup: "metal"/"cuda" when recurrences run `kernels/gated_delta`.
        self.recurrence_backend: str | None = None
        # Prefill widths and chunk ends are rounded up to multiples of this, so attention
        # shapes repeat: MLX's CUDA SDPA builds a cuDNN graph (~70 ms) per new shape. 1: off.
        self.prefill_align = 1
        # Prefill attention in power-of-two buckets, warmed before serving (`PrefillShapes`);
        # set on CUDA by the paged setup, None elsewhere.
        self.prefill_shapes = None
        # Set on CUDA by the paged setup: a mixed step is padded so that its rows in all come in
        # few sizes (`runner/chunk_rows.py`), as MLX's CUDA graphs and cuBLAS pay for every new
        # row count (a graph built, a kernel chosen) on the engine thread.
        self.bucket_mixed_steps = False
        # Set by the paged setup where decode runs kernels: a mixed step's chunk tokens attend as
        # decode rows of their own, within `CHUNK_ROW_READS` (`runner/chunk_rows.py`).
        self.chunks_as_rows = False
        # (path, phase) -> attention calls, one per layer per forward; shown in /metrics.
        self.attention_calls: Counter = Counter()
        # The fused split-K kernel's partition counters, handed from call to call.
        self.counters = CounterChain()
        # Per layer, the RoPE frequencies of decode steps that fuse RoPE into attention; None
        # when they do not (set by the paged setup).
        self.rope_inv_freq: list[mx.array] | None = None
        self.num_layers = num_layers
        # id(keys) -> (keys, cache) of the K/V this forward's caches returned (see
        # `PagedLayerCache.update_and_fetch`); the runner clears it before each forward.
        self.fetched: dict[int, tuple] = {}
        self.pages = self._zero_pages()

    def _layer_views(self, shapes: list[tuple[int, int, int]]) -> list[tuple | None]:
        """Per layer of another shape than its array's, the K and V shapes it reads the array
        as: its group's page scale times the pages (`kv_groups.py`); None for the others."""
        views: list[tuple | None] = [None] * len(shapes)
        for layer, viewed in enumerate(self.groups.read_at_another_shape(shapes)):
            if viewed:
                h, k, v = shapes[layer]
                pages = self.num_blocks * self.groups.scale(self.groups.layer_group[layer])
                views[layer] = ((pages, self.block_size, h, k), (pages, self.block_size, h, v))
        return views

    @property
    def quantized(self) -> bool:
        return min(self.k_bits, self.v_bits) < 16

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pages)

    def _zero_pages(self) -> list:
        def layer_pages(shape, value_dim):
            if self.quantized:
                return QuantizedKVPages.zeros(shape, self.dtype, self.k_bits, self.v_bits,
                                              self.group_size, value_dim)  # fmt: skip
            rows = shape[0] * shape[1]
            return KVPages(mx.zeros((rows, *shape[2:]), dtype=self.dtype),
                           mx.zeros((rows, shape[2], value_dim), dtype=self.dtype))  # fmt: skip

        pages = [layer_pages(*a) for a in zip(self.page_shapes, self.value_dims)]
        mx.eval(pages)
        return pages

    def repair(self) -> bool:
        """After a failed step: evaluate the pages, or, when their pending writes throw (the
        step that queued them failed), zero them. True if the pages' contents were lost."""
        try:
            mx.eval(self.pages)
            return False
        except Exception:
            self.pages = self._zero_pages()
            return True

    def layer_side(self, layer: int, side: int):
        """`layer`'s K (side 0) or V (side 1) pages: 16-bit ones as `[blocks, block_size,
        heads, dim]` in the layer's own shape (a reshaped view of the flat array)."""
        pages = self.pages[self.layer_array[layer]]
        pages = pages.k if side == 0 else pages.v
        if isinstance(pages, QuantizedPages):  # no layer reads quantized pages at another shape
            return pages
        return pages.reshape(self.layer_shapes(layer)[side])

    def flat_side(self, layer: int, side: int) -> mx.array:
        """`layer`'s 16-bit K or V pages as the flat rows `[blocks * block_size, heads, dim]`
        the decode kernels read (a view where the layer has another shape than its array)."""
        pages = self.pages[self.layer_array[layer]]
        pages = pages.k if side == 0 else pages.v
        view = self.layer_views[layer]
        return pages if view is None else pages.reshape(_flat(view[side]))

    def layer_shapes(self, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The 4D K and V page shapes `layer` reads."""
        view = self.layer_views[layer]
        return view if view is not None else self.array_shapes(self.layer_array[layer])

    def array_shapes(self, array: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The 4D K and V page shapes of page array `array`."""
        shape = self.page_shapes[array]
        return shape, (*shape[:3], self.value_dims[array])

    def write(self, layer: int, keys: mx.array, values: mx.array, mapping: SlotMapping) -> None:
        """Scatter `(B, H, L, D)` keys/values (or `(N, H, D)` rows) into `layer`'s pages at
        `mapping` (quantized on the way where the pages are)."""
        new = []
        for x in (keys, values):
            if x.ndim == 4:
                batch, heads, length, dim = x.shape
                if length > 1:
                    x = x.transpose(0, 2, 1, 3)
                x = x.reshape(batch * length, heads, dim)
            new.append(x.astype(self.dtype))
        array, view = self.layer_array[layer], self.layer_views[layer]
        pages = self.pages[array]
        self.pages[array] = None  # drop our reference before the scatter: it may reuse the buffer
        try:
            if isinstance(pages, QuantizedKVPages):
                pages = pages.write(mapping.rows(self.block_size), *new)
            elif view is None:
                pages = pages.write(mapping, *new)
            else:  # through the layer's view, back to the array's own shape
                pages = _viewed(_viewed(pages, view).write(mapping, *new), self.array_shapes(array))
        finally:
            self.pages[array] = pages


def _flat(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A 4D page shape `[blocks, block_size, heads, dim]` as flat rows."""
    return (shape[0] * shape[1], *shape[2:])


def _viewed(pages: KVPages, shapes) -> KVPages:
    """16-bit `pages` as flat rows of the 4D K and V `shapes`, no copy."""
    return KVPages(*(x.reshape(_flat(s)) for x, s in zip(pages, shapes)))


@dataclass
class PagedMask:
    """What `make_mask` hands the model; the attention hook turns it into a real mask. The
    attention adapters (`kv/attention_adapters.py`) add a score cap or attention chunks."""

    window: int | None = None
    softcap: float | None = None
    chunk: int | None = None  # keys visible only within the query's chunk of this many


class PagedLayerCache:
    """The per-layer cache object an mlx-lm model receives. It has no `bits` attribute (that
    would route mlx-lm to quantized attention) and no `__len__`, so it is always truthy."""

    def __init__(self, pool: PagedKVPool, layer: int, metadata: PagedAttentionMetadata):
        self.pool = pool
        self.layer = layer
        self.metadata = metadata

    @property
    def offset(self) -> mx.array | DeferredOffset:
        if self.metadata.rope_in_attention:
            return DeferredOffset(self.metadata.offsets)
        return self.metadata.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if not self.metadata.rope_in_attention:  # else the attention hook writes them, rotated
            self.pool.write(self.layer, keys, values, self.metadata.slot_mapping)
        # A KV-shared layer attends to these same arrays with no cache of its own: the hook
        # finds this layer's pages through them.
        self.pool.fetched[id(keys)] = (keys, self)
        return keys, values

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None):
        # Even where a dense array is asked for: attention builds the same causal (windowed)
        # mask from the pages, and the probe refuses models that use the array themselves.
        return PagedMask(window_size)

    @property
    def k_pages(self):
        """This layer's K pages: an array, or the K side of quantized pages."""
        return self.pool.layer_side(self.layer, 0)

    @property
    def v_pages(self):
        return self.pool.layer_side(self.layer, 1)

    @property
    def decode_pages(self) -> tuple:
        """The K and V pages as the decode kernels take them: 16-bit ones as flat rows (no
        reshape node; the launch is given the block size), quantized ones as they are."""
        if self.pool.quantized:
            return self.k_pages, self.v_pages
        return self.pool.flat_side(self.layer, 0), self.pool.flat_side(self.layer, 1)
