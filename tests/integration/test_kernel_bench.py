"""The kernel benchmark's machinery on the CPU: problems, timing, the peers, the table, the JSON
shape and the plot (the paged kernel itself needs a GPU and is skipped here, visibly)."""

from __future__ import annotations

import argparse

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.bench import kernels
from mlx_paged.kernels.paged_attention_reference import paged_attention_reference
from mlx_paged.kernels.quantized_pages import QuantizedKVPages


def _args(**changes) -> argparse.Namespace:
    base = dict(
        batch=[2],
        context=[64],
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype="float32",
        pool_gb=0.001,
        max_kv_gb=1.0,
        kernel=["decode_simt_splitk"],
        sequential_blocks=False,
    )
    return argparse.Namespace(**(base | changes))


def test_problem_pages_are_shuffled_or_consecutive():
    common = dict(
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        dtype=mx.float32,
        pool_bytes=1 << 20,
    )
    _, k_pages, _, tables, lens = kernels.make_problem(3, 40, **common)
    ids = np.array(tables).ravel()
    assert tables.shape == (3, 3) and len(set(ids.tolist())) == 9 and 0 not in ids
    assert k_pages.shape[0] * 16 * 2 * 64 * 4 * 2 >= 1 << 20  # the pool is at least pool_bytes
    assert not np.array_equal(ids, np.sort(ids))
    _, _, _, seq, _ = kernels.make_problem(3, 40, sequential_blocks=True, **common)
    assert np.array(seq).ravel().tolist() == list(range(1, 10))
    assert np.array(lens).tolist() == [40, 40, 40]


def test_head_major_pages_are_quantized_rows_only():
    """The kernels read 16-bit pages as flat token-major rows, so `--head-major-pages` takes
    `--kv-bits`; the problem's pages are the token-major shape, as a view."""
    common = dict(
        num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, dtype=mx.float32, pool_bytes=1 << 12
    )
    _, k_pages, _, _, _ = kernels.make_problem(2, 10, head_major_pages=True, **common)
    assert k_pages.shape == (k_pages.shape[0], 4, 2, 8)
    with pytest.raises(ValueError, match="--kv-bits 8 or 4"):
        kernels.bench_shape(2, 64, _args(head_major_pages=True), torch_ok=False)


def test_bench_shape_on_the_cpu_times_the_peers_and_skips_the_kernel(capsys):
    row = kernels.bench_shape(2, 64, _args(), torch_ok=False)
    out = capsys.readouterr().out
    # Without a GPU every kernel method is refused by name and left out, not faked.
    for name in ("paged", "paged_decode_simt_splitk"):
        assert f"{name} skipped" in out and name in row["skipped"] and name not in row["us"]
    assert set(row["us"]) == {"gather_sdpa", "mlx_sdpa"}
    assert row["diff_base"] == "gather_sdpa"
    assert row["max_abs_diff_vs_paged"]["mlx_sdpa"] < 1e-5  # same data, same attention
    assert row["kv_bytes"] == 2 * 2 * 64 * 2 * 64 * 4
    assert all(v > 0 for v in row["tb_s"].values())
    kernels.print_row(row, copy_tb_s=1.0)
    assert "B=   2 T=    64" in capsys.readouterr().out


def test_chained_timing_feeds_each_output_to_the_next_call():
    calls = []

    def attention(queries):
        calls.append(queries)
        return queries * 2

    queries = mx.ones((1, 2, 1, 4))
    assert kernels.time_mlx_chained(attention, queries, target_s=0.001, repeats=2) > 0
    # Two warm-up calls, then two samples of at least two calls, each fed the previous output.
    assert len(calls) >= 6 and calls[0] is queries and calls[1] is queries
    assert mx.array_equal(calls[3], calls[2] * 2).item()
    row = kernels.bench_shape(2, 64, _args(chained=True), torch_ok=False)
    assert set(row["us"]) == {"gather_sdpa", "mlx_sdpa"}
    assert row["max_abs_diff_vs_paged"]["mlx_sdpa"] < 1e-5


def test_pipelined_chained_timing_starts_evaluations_between_builds(monkeypatch):
    started = []
    monkeypatch.setattr(kernels.mx, "async_eval", lambda *arrays: started.append(arrays[0]))
    calls = []

    def attention(queries):
        calls.append(queries)
        return queries * 2

    queries = mx.ones((1, 2, 1, 4))
    assert kernels.time_mlx_chained(attention, queries, target_s=0.001, repeats=2, pipeline=2) > 0
    # Every second call's output starts evaluating (4, 16, ... times the queries of its run);
    # the chain is unchanged.
    exponents = [np.log2(np.array(out)).ravel() for out in started]
    assert started and all((e == e[0]).all() and e[0] % 2 == 0 and e[0] > 0 for e in exponents)
    assert len(started) >= (len(calls) - 2) // 2 - 2
    assert mx.array_equal(calls[3], calls[2] * 2).item()


def test_pipelined_needs_chained(capsys):
    assert kernels.main(_args(pipelined=True, chained=False, replot=None)) == 2
    assert "add --chained" in capsys.readouterr().out


def test_skipped_methods_are_left_out():
    row = kernels.bench_shape(2, 64, _args(skip=["gather_sdpa"]), torch_ok=False)
    assert set(row["us"]) == {"mlx_sdpa"} and row["diff_base"] == "mlx_sdpa"
    row = kernels.bench_shape(2, 64, _args(skip=["gather_sdpa", "mlx_sdpa"]), torch_ok=False)
    assert row["us"] == {} and row["diff_base"] is None


def test_plot_draws_every_method(tmp_path):
    row = kernels.bench_shape(2, 64, _args(), torch_ok=False)
    result = {"title": "cpu smoke", "copy": {"copy_tb_s": 0.01}, "rows": [row]}
    assert kernels.plot(result, tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 1000


def test_quantized_sweep_reads_quantized_pages_and_counts_their_bytes(capsys):
    """On the CPU the kernels are refused; the reference reads the 4-bit pages and its
    bandwidth counts their bytes (packed values, scales, biases), the peers the 16-bit ones."""
    row = kernels.bench_shape(2, 64, _args(kv_bits=4, kv_group_size=32), torch_ok=False)
    assert "paged_16bit skipped" in capsys.readouterr().out
    per_token = 2 * (64 * 4 // 8 + 2 * 2 * 4)  # 2 KV heads; fp32 scales and biases
    assert row["read_bytes"] == 2 * 2 * 64 * per_token
    us = row["us"]
    assert row["tb_s"]["gather_sdpa"] == pytest.approx(row["read_bytes"] / us["gather_sdpa"] / 1e6)
    assert row["tb_s"]["mlx_sdpa"] == pytest.approx(row["kv_bytes"] / us["mlx_sdpa"] / 1e6)
    # Quantized attention differs from the 16-bit peer by the quantization error only.
    assert 1e-5 < row["max_abs_diff_vs_paged"]["mlx_sdpa"] < 0.2


def test_head_major_pages_hold_quantized_rows_through_the_view():
    """With `--kv-bits`, `--head-major-pages` stores the quantized rows head-major as well: the
    view holds the rows packed from the same pages token-major, and the reference reads the
    same attention through it."""
    problem = kernels._problem(2, 64, _args(kv_bits=4, kv_group_size=32, head_major_pages=True))
    k_side, v_side = problem.read
    token_major = QuantizedKVPages.from_values(problem.k_pages, problem.v_pages, 4, 4, 32)
    assert k_side.kv.rows.shape == token_major.rows.shape
    assert np.array_equal(np.array(k_side.kv.rows), np.array(token_major.rows))
    positions = (problem.lens - 1)[:, None]
    args = (problem.tables, problem.lens, positions)
    out = paged_attention_reference(problem.q, k_side, v_side, *args, scale=problem.scale)
    ref = paged_attention_reference(problem.q, token_major.k, token_major.v, *args,
                                    scale=problem.scale)  # fmt: skip
    assert mx.array_equal(out, ref)


@pytest.mark.parametrize("chained", [False, True], ids=["independent", "chained"])
def test_the_latent_sweep_reads_one_latent_and_rope_row_a_token(chained):
    """`--latent-dims`: the reference over shuffled latent pages, its output fed back as the
    next call's latent queries under `--chained`; on the CPU no kernel runs."""
    from mlx_paged.bench.latent_kernels import bench_latent_shape, latent_problem

    args = _args(latent_dims=[64, 16], num_heads=8, pool_gb=0.0001, chained=chained,
                 pipelined=False)  # fmt: skip
    problem = latent_problem(3, 40, args)
    ids = np.array(problem["tables"]).ravel()
    assert problem["tables"].shape == (3, 3) and len(set(ids.tolist())) == 9 and 0 not in ids
    row = bench_latent_shape(3, 40, args, kernels._timer(args))
    assert row["read_bytes"] == 3 * 40 * (64 + 16) * 4
    assert list(row["us"]) == ["gather_sdpa"] and row["diff_base"] == "gather_sdpa"
    assert row["tb_s"]["gather_sdpa"] > 0
    q_latent, q_rope = problem["q"]
    assert q_latent.shape == (3, 8, 1, 64) and q_rope.shape == (3, 8, 1, 16)
