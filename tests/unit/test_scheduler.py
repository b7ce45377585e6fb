"""Scheduler policy, step by step, with exact expectations."""

import pytest

from mlx_paged.engine.scheduler import Scheduler
from mlx_paged.engine.step_pacer import StepPacer
from mlx_paged.request import Request, RequestStatus
from mlx_paged.sampling.sampling_params import SamplingParams


def req(name: str, n: int, **params) -> Request:
    r = Request(list(range(1, n + 1)), SamplingParams(**params))
    r.request_id = name
    return r


def ids(reqs):
    return [r.request_id for r in reqs]


def plan_view(plan):
    return (ids(plan.joining), ids(plan.starting), [(r.request_id, n) for r, n in plan.prefill])


def test_prompt_goes_prefill_then_start_then_decode():
    s = Scheduler(max_num_seqs=4, max_num_prefill_seqs=2, prefill_step_size=3)
    a = req("a", 8)
    s.add_request(a)
    assert s.schedule_decode() == ([], [])
    # 8 tokens: 7 are prefilled in chunks of 3, the last one starts generation on its own.
    assert plan_view(s.schedule_prompts()) == (["a"], [], [("a", 3)])
    assert plan_view(s.schedule_prompts()) == ([], [], [("a", 3)])
    assert plan_view(s.schedule_prompts()) == ([], [], [("a", 1)])
    assert a.num_computed_tokens == 7 and a.status == RequestStatus.PREFILLING
    assert plan_view(s.schedule_prompts()) == ([], ["a"], [])
    assert a.status == RequestStatus.RUNNING and a.num_computed_tokens == 8
    assert ids(s.schedule_decode()[0]) == ["a"]


def test_one_token_prompt_starts_in_its_admission_step():
    s = Scheduler()
    s.add_request(req("a", 1))
    assert plan_view(s.schedule_prompts()) == (["a"], ["a"], [])


def test_admission_is_fcfs_and_capped_by_prefill_and_decode_slots():
    s = Scheduler(max_num_seqs=3, max_num_prefill_seqs=2, prefill_step_size=100)
    for name in "abcde":
        s.add_request(req(name, 5))
    assert plan_view(s.schedule_prompts()) == (["a", "b"], [], [("a", 4), ("b", 4)])
    # Admission comes before starting (BatchGenerator's order): the prefill batch is still full.
    assert plan_view(s.schedule_prompts()) == ([], ["a", "b"], [])
    assert ids(s.running) == ["a", "b"]
    # Two prefill slots free, but only one decode slot: one request joins.
    assert plan_view(s.schedule_prompts()) == (["c"], [], [("c", 4)])
    # Room is counted before "c" starts, so "d" joins as the decode batch fills up.
    assert plan_view(s.schedule_prompts()) == (["d"], ["c"], [("d", 4)])
    assert ids(s.running) == ["a", "b", "c"]
    # Decode batch full: no prompt work at all; "d" waits half-prefilled.
    assert plan_view(s.schedule_prompts()) == ([], [], [])
    assert ids(s.waiting) == ["e"]
    s.finish(s.running[1], RequestStatus.FINISHED_LENGTH)
    assert ids(s.schedule_decode()[0]) == ["a", "c"]
    assert plan_view(s.schedule_prompts()) == (["e"], ["d"], [("e", 4)])
    assert ids(s.running) == ["a", "c", "d"]


def test_decode_batch_never_smaller_than_prefill_batch():
    s = Scheduler(max_num_seqs=1, max_num_prefill_seqs=4)
    assert s.max_num_seqs == 4


def test_unbatchable_request_drains_the_batch_then_runs_alone():
    s = Scheduler(max_num_seqs=8, max_num_prefill_seqs=8)
    s.add_request(req("a", 2))
    assert plan_view(s.schedule_prompts()) == (["a"], [], [("a", 1)])
    s.add_request(req("seeded", 2, seed=7))
    s.add_request(req("b", 2))
    # The seeded request is at the head: it waits for "a", and "b" queues behind it (FCFS).
    assert plan_view(s.schedule_prompts()) == ([], ["a"], [])
    assert plan_view(s.schedule_prompts()) == ([], [], [])
    s.finish(s.running[0], RequestStatus.FINISHED_STOPPED)
    assert plan_view(s.schedule_prompts()) == (["seeded"], [], [("seeded", 1)])
    # Nothing joins it while it runs.
    assert plan_view(s.schedule_prompts()) == ([], ["seeded"], [])
    assert plan_view(s.schedule_prompts()) == ([], [], [])
    s.finish(s.running[0], RequestStatus.FINISHED_LENGTH)
    assert plan_view(s.schedule_prompts()) == (["b"], [], [("b", 1)])


class AllowList:
    """A KV space that admits only the listed requests and always has decode room."""

    def __init__(self, allowed):
        self.allowed = allowed

    def admit(self, request):
        return request.request_id in self.allowed

    def allocate_decode(self, request):
        return True

    def allocate_chunk(self, request, num_tokens):
        return True

    def free(self, request, cache_computed=False):
        pass


def test_kv_admission_blocks_the_head_of_the_queue():
    allowed = {"a"}
    s = Scheduler(kv=AllowList(allowed))
    s.add_request(req("a", 3))
    s.add_request(req("b", 3))
    s.add_request(req("c", 3))
    assert ids(s.schedule_prompts().joining) == ["a"]
    assert ids(s.waiting) == ["b", "c"]
    allowed.add("b")
    assert ids(s.schedule_prompts().joining) == ["b"]


def test_finish_removes_from_any_queue():
    s = Scheduler(max_num_prefill_seqs=1)
    a, b, c = req("a", 1), req("b", 5), req("c", 5)
    for r in (a, b, c):
        s.add_request(r)
    s.schedule_prompts()  # a starts (1 token)
    s.schedule_prompts()  # b joins
    assert (ids(s.running), ids(s.prefilling), ids(s.waiting)) == (["a"], ["b"], ["c"])
    for r in (a, b, c):
        s.finish(r, RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests()
    assert all(r.status == RequestStatus.FINISHED_ABORTED for r in (a, b, c))


def test_token_budget_chunks_prompts_between_decode_rows():
    s = Scheduler(max_num_seqs=4, max_num_prefill_seqs=3, prefill_step_size=8,
                  max_num_batched_tokens=10)  # fmt: skip
    for name, n in (("a", 30), ("b", 5), ("c", 4)):
        s.add_request(req(name, n))
    # Nothing decodes: no stream waits on the step, so every request takes its whole chunk.
    assert plan_view(s.schedule_prompts()) == (["a", "b", "c"], [], [("a", 8), ("b", 4), ("c", 3)])
    # Three decode rows and the two starting requests leave 5 tokens: a takes them.
    assert plan_view(s.schedule_prompts(num_decode_rows=3)) == ([], ["b", "c"], [("a", 5)])
    assert plan_view(s.schedule_prompts(num_decode_rows=3)) == ([], [], [("a", 7)])
    # No decode rows again: a's whole chunk, then its last token but one.
    assert plan_view(s.schedule_prompts()) == ([], [], [("a", 8)])
    assert plan_view(s.schedule_prompts()) == ([], [], [("a", 1)])
    assert plan_view(s.schedule_prompts()) == ([], ["a"], [])


def test_token_budget_must_leave_room_for_prompts():
    with pytest.raises(ValueError, match="must exceed the decode concurrency"):
        Scheduler(max_num_seqs=8, max_num_batched_tokens=8)


def test_a_paced_step_shares_its_budget_equally_then_in_order():
    s = Scheduler(max_num_seqs=8, max_num_prefill_seqs=4, prefill_step_size=2048)
    s.step_token_budget = 100
    long, short = req("long", 1000), req("short", 11)
    s.add_request(long)
    assert plan_view(s.schedule_prompts()) == (["long"], [], [("long", 100)])
    s.add_request(short)  # arrives while the long prompt is prefilled
    # Equal shares of 50: the short one needs 10 (its last token starts it); the rest is long's.
    assert plan_view(s.schedule_prompts()) == (["short"], [], [("long", 90), ("short", 10)])
    # The starting request's token counts against the budget.
    assert plan_view(s.schedule_prompts()) == ([], ["short"], [("long", 99)])
    assert long.num_computed_tokens == 289


def test_at_the_pacers_ceiling_decode_rows_leave_the_chunks_whole():
    """The pacer's ceiling is every prefilling request's whole chunk plus the decode rows: rows
    that decode beside the chunks must not cut each prompt a few tokens short (the rest of
    every prompt would cost a step of its own)."""
    s = Scheduler(max_num_seqs=64, max_num_prefill_seqs=8, prefill_step_size=2048,
                  prefill_align=64)  # fmt: skip
    pacer = StepPacer(0.5, 8 * 2048 + 64)  # as the engine builds it
    pacer.observe(16384, 0.09)  # 16k prompt tokens in 90 ms: the target fits far more
    s.step_token_budget = pacer.budget
    for i in range(8):
        s.add_request(req(f"p{i}", 2048))
    chunks = plan_view(s.schedule_prompts(num_decode_rows=56))[2]
    assert chunks == [(f"p{i}", 2047) for i in range(8)]


def test_a_paced_step_keeps_prompt_room_beside_many_decode_rows():
    s = Scheduler(max_num_seqs=64, max_num_prefill_seqs=4, prefill_step_size=2048)
    s.step_token_budget = 40
    s.add_request(req("p", 500))
    # 60 rows decode: more than the budget, yet the prompt gets its floor of 4 tokens.
    assert plan_view(s.schedule_prompts(num_decode_rows=60)) == (["p"], [], [("p", 4)])


def test_beside_decode_rows_a_paced_step_keeps_to_the_decoding_prompt_budget():
    s = Scheduler(max_num_seqs=64, max_num_prefill_seqs=4, prefill_step_size=2048)
    s.step_token_budget, s.decoding_prompt_budget = 4096, 128
    s.add_request(req("p", 1000))
    assert plan_view(s.schedule_prompts(num_decode_rows=8)) == (["p"], [], [("p", 128)])
    # With no row decoding, the step budget alone applies.
    assert plan_view(s.schedule_prompts()) == ([], [], [("p", 871)])


def test_beside_decode_rows_the_capped_budget_goes_in_shares_of_at_least_256():
    s = Scheduler(max_num_seqs=64, max_num_prefill_seqs=8, prefill_step_size=2048)
    s.step_token_budget, s.decoding_prompt_budget = 4096, 640
    for name in "abcd":
        s.add_request(req(name, 1000))
    # 640 tokens: two shares of 320 (four of 160 would add two chunks' attention calls).
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("a", 320), ("b", 320)]
    # With no row decoding, the step budget in shares of `prefill_align`: everyone's rest.
    assert plan_view(s.schedule_prompts())[2] == [("a", 679), ("b", 679), ("c", 999), ("d", 999)]


def test_beside_decode_rows_chunks_keep_within_the_reads_of_chunk_rows():
    """Where the runner runs a mixed step's chunks as decode rows (`chunk_read_limit`), a paced
    step with rows takes the chunks whose row reads fit; with none decoding, the limit is moot."""
    s = Scheduler(max_num_seqs=64, max_num_prefill_seqs=8, prefill_step_size=2048,
                  prefill_align=16, chunk_read_limit=1 << 18)  # fmt: skip
    s.step_token_budget = 16384
    for name in "abc":
        s.add_request(req(name, 512))
    # Two whole prompts read 2 x 130,816 context tokens as rows; a third would pass 262,144.
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("a", 511), ("b", 511)]
    mid, long = req("mid", 1000), req("long", 4096)
    s.add_request(mid)
    s.add_request(long)
    # c goes whole; the 512 tokens left for mid would leave it 487, too many for one step.
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("c", 511)]
    # mid is cut to the 720 tokens whose reads fit (ending on 16); its 279 go next step.
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("mid", 720)]
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("mid", 279)]
    # Rows would take the long prompt in many small steps: the step attends it as prefill.
    assert plan_view(s.schedule_prompts(num_decode_rows=8))[2] == [("long", 2048)]
    # With no row decoding, the limit does not apply.
    s.add_request(req("d", 2048))
    assert plan_view(s.schedule_prompts())[2] == [("long", 2047), ("d", 2047)]


def test_paced_shares_are_whole_alignments_for_as_many_requests_as_fit():
    s = Scheduler(max_num_seqs=8, max_num_prefill_seqs=4, prefill_step_size=2048, prefill_align=64)
    s.step_token_budget = 150
    a, b, c = req("a", 1000), req("b", 1000), req("c", 1000)
    for r in (a, b, c):
        s.add_request(r)
    # Two shares of 75 fit 64-token alignments; each is cut to 64, c waits for the next step.
    assert plan_view(s.schedule_prompts()) == (["a", "b", "c"], [], [("a", 64), ("b", 64)])
    s.step_token_budget = 40  # below one alignment: the step's first keeps it, unaligned
    assert plan_view(s.schedule_prompts()) == ([], [], [("a", 40)])


def test_a_prompt_sent_back_for_window_blocks_is_not_admitted_before_another_progresses():
    """Admission takes a prompt's full-attention blocks, its window blocks come chunk by chunk:
    two prompts that each wait for window blocks held by the other's admission would send one
    back and admit it again, step after step, without the hold."""
    from mlx_paged.kv.kv_cache_manager import KVCacheManager

    kv = KVCacheManager(num_blocks=27, block_size=4, group_windows=(None, 8))
    s = Scheduler(kv=kv, prefill_step_size=64)
    for r in (req("a", 40), req("b", 40)):
        s.add_request(r)
    plan = s.schedule_prompts()
    # Both took 10 full-group blocks, leaving 6: neither's 10 window blocks fit, b goes back.
    assert ids(plan.joining) == ["a"] and not plan.prefill and ids(s.waiting) == ["b"]
    plan = s.schedule_prompts()
    assert not plan.joining and [(r.request_id, n) for r, n in plan.prefill] == [("a", 39)]
    assert not s.admission_held  # a progressed: b may join again, when its blocks fit
    plan = s.schedule_prompts()
    assert ids(plan.starting) == ["a"] and ids(s.waiting) == ["b"]


def test_the_engine_limits_chunk_reads_only_where_chunks_ride_as_rows():
    from types import SimpleNamespace

    from mlx_paged.engine.runner_setup import scheduling_limits
    from mlx_paged.runner.chunk_rows import CHUNK_ROW_READS

    runner = SimpleNamespace(pool=SimpleNamespace(prefill_align=64, chunks_as_rows=True))
    assert scheduling_limits(runner, kv=object()) == {
        "prefill_align": 64,
        "start_in_decode": True,
        "chunk_read_limit": CHUNK_ROW_READS,
    }
    runner.pool.chunks_as_rows = False
    assert scheduling_limits(runner, kv=object())["chunk_read_limit"] is None
    assert scheduling_limits(SimpleNamespace(), kv=None) == {
        "prefill_align": 1,
        "start_in_decode": False,
    }
