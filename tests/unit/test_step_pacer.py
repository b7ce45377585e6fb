"""The pacer sizes prompt chunks from measured step times: exact arithmetic."""

from mlx_paged.engine.metrics import EngineMetrics
from mlx_paged.engine.step_pacer import MIN_TOKENS, StepPacer


def test_off_without_a_target():
    pacer = StepPacer(None, 4096)
    pacer.observe(100, 1.0)
    assert pacer.budget is None


def test_starts_at_the_floor_then_fits_the_target_in_powers_of_two():
    pacer = StepPacer(0.5, 16384)
    assert pacer.budget == MIN_TOKENS  # a slow device's first step must not stall
    pacer.observe(100, 0.01)  # 0.1 ms a token: 5,000 fit, 4,096 as a power of two
    assert pacer.budget == 4096
    pacer.observe(4096, 4096 * 0.0003)  # dearer: the estimate moves halfway, 0.2 ms -> 2,048
    assert abs(pacer.seconds_per_token - 0.0002) < 1e-12 and pacer.budget == 2048
    pacer.observe(2048, 2048 * 0.00005)  # cheaper: believed at once, 10,000 fit -> 8,192
    assert pacer.seconds_per_token == 0.00005 and pacer.budget == 8192


def test_clamped_to_the_ceiling_and_the_floor():
    pacer = StepPacer(0.5, 3000)
    pacer.observe(1000, 0.001)  # 1 us a token: 500,000 fit; the ceiling, as it is
    assert pacer.budget == 3000
    below = StepPacer(0.5, 3000)
    below.observe(1000, 0.2)  # 2,500 fit: below the ceiling, a power of two
    assert below.budget == 2048
    slow = StepPacer(0.5, 3000)
    slow.observe(10, 5.0)  # 0.5 s a token (a CPU): one would fit; the floor holds
    assert slow.budget == MIN_TOKENS


def test_only_steps_with_prompt_work_filling_half_the_budget_are_observed():
    pacer = StepPacer(0.5, 16384)
    metrics = EngineMetrics()
    metrics.prompt_tokens_total, metrics.generation_tokens_total = 10, 5
    mark = pacer.mark(metrics)
    metrics.generation_tokens_total = 69  # a decode-only step: its fixed cost says nothing
    assert pacer.after_step(metrics, mark) == MIN_TOKENS and pacer.seconds_per_token is None
    mark = pacer.mark(metrics)
    metrics.prompt_tokens_total, metrics.generation_tokens_total = 14, 73  # 4 prompt tokens
    pacer.after_step(metrics, mark)
    assert pacer.seconds_per_token is not None and pacer.seconds_per_token > 0
    pacer.seconds_per_token = 0.0001  # a budget of 4,096
    mark = pacer.mark(metrics)
    metrics.prompt_tokens_total += 64  # 64 prompts' last tokens start (and sample 64 tokens):
    metrics.generation_tokens_total += 64  # far below the budget
    assert pacer.after_step(metrics, mark) == 4096 and pacer.seconds_per_token == 0.0001


def test_steps_beside_decode_rows_feed_the_mixed_step_cap():
    pacer = StepPacer(0.5, 16384, itl_ratio=4.0)
    metrics = EngineMetrics()
    mark = pacer.mark(metrics)
    metrics.generation_tokens_total = 8  # decode-only
    pacer.after_step(metrics, mark)
    mark = pacer.mark(metrics)
    metrics.prompt_tokens_total, metrics.generation_tokens_total = 256, 16  # chunks beside rows
    metrics.mixed_steps_total += 1
    pacer.after_step(metrics, mark)
    mark = pacer.mark(metrics)
    metrics.prompt_tokens_total, metrics.generation_tokens_total = 259, 27  # 3 rows start: a
    pacer.after_step(metrics, mark)  # decode step, whose new rows feed their last prompt token
    mark = pacer.mark(metrics)
    metrics.prompt_tokens_total = 771  # a prompt alone: no decode rows, not the cap's
    metrics.prefill_seconds_total += 0.01
    pacer.after_step(metrics, mark)
    assert len(pacer.mixed_cap.decode_steps) == 2
    assert [n for n, _ in pacer.mixed_cap.mixed_steps] == [256]
    assert pacer.decoding_budget in (128, 512)  # half or twice 256, as the step kept to 4x
    assert StepPacer(0.5, 16384).decoding_budget is None
    assert StepPacer(None, 16384, itl_ratio=4.0).decoding_budget is None
