"""Continuous-batching scheduler: which requests decode, join, start and prefill each step.
Pure Python; it never touches MLX, so its policy is unit-tested exactly.

The rule, per step (mlx-lm's BatchGenerator order, so the contiguous path matches it token for
token):
  1. every RUNNING request decodes one token (`schedule_decode`); requests that finish leave;
  2. then (`schedule_prompts`), if fewer than `max_num_seqs` are running, WAITING requests join
     the prefill batch (at most `max_num_prefill_seqs` at once, FCFS, if the KV path admits);
  3. prefilling requests with exactly their last prompt token left start generating: that token
     runs through the model on its own and the request becomes RUNNING (it decodes next step);
  4. every other prefilling request gets a chunk of at most `prefill_step_size` prompt tokens,
     FCFS, within the step's token budget (`max_num_batched_tokens`) when rows decode: the
     decode rows and starting requests count one token each, so a long prompt is prefilled in
     chunks between decode steps instead of stalling them. On the paged path the engine's
     pacer also sets a budget for every step (`StepPacer`), shared equally among prompts;
     while rows decode, chunks ride as decode rows where they can (`within_row_reads`).
The paged engine plans 2-4 before the step's decode forward and runs the chunks inside it.
A request that is not batchable (a fixed seed) waits at the head of the queue until nothing
else runs, then runs alone.

With a paged KV path (`kv`), admission also needs the request's prompt blocks (prefix-cache hits
count as computed), and every decode row needs a slot for its next token: when the pool runs
dry, the most recently admitted running request is preempted (its blocks are freed and it goes
back to the front of the queue, to be recomputed later from its prompt and output so far).
"""

from __future__ import annotations

from collections import deque

from mlx_paged.engine.kv_space import KVSpace
from mlx_paged.engine.prompt_shares import (
    MIN_DECODING_SHARE,
    aligned_cut,
    shared_grants,
    within_row_reads,
)
from mlx_paged.engine.step_pacer import MIN_TOKENS
from mlx_paged.request import PromptSchedule, Request, RequestStatus


class Scheduler:
    """Holds the WAITING queue, the prefill batch and the RUNNING (decode) batch.

    Args:
        max_num_seqs: most requests decoding at once (`--decode-concurrency`).
        max_num_prefill_seqs: most requests prefilling at once (`--prompt-concurrency`).
        prefill_step_size: most prompt tokens one request prefills per step.
        max_num_batched_tokens: most tokens a step with decode rows runs, those rows included
            (None: no budget); a step without decode rows gives each prefilling request its
            `prefill_step_size` chunk. Must exceed `max_num_seqs`, so prompts progress.
        kv: the paged KV path's admission and allocation (None: the contiguous path, which
            admits anything).
        prefill_align: chunks the budget cuts end on multiples of this (`prefill_align`).
        chunk_read_limit: while rows decode, most context tokens a paced step's chunks may
            read a layer as decode rows (`CHUNK_ROW_READS`); None: no chunk rides as rows.
        start_in_decode: requests with one prompt token left join the running batch through
            `schedule_starting`, and the decode forward feeds that token (the paged path);
            else `schedule_prompts` starts them, for a forward of their own.
    """

    def __init__(
        self,
        *,
        max_num_seqs: int = 32,
        max_num_prefill_seqs: int = 8,
        prefill_step_size: int = 2048,
        max_num_batched_tokens: int | None = None,
        kv: KVSpace | None = None,
        prefill_align: int = 1,
        start_in_decode: bool = False,
        chunk_read_limit: int | None = None,
    ):
        if min(max_num_seqs, max_num_prefill_seqs, prefill_step_size) < 1:
            raise ValueError("max_num_seqs, max_num_prefill_seqs, prefill_step_size must be >= 1")
        # BatchGenerator never lets the decode batch be smaller than the prefill batch.
        self.max_num_seqs = max(max_num_seqs, max_num_prefill_seqs)
        if max_num_batched_tokens is not None and max_num_batched_tokens <= self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must exceed the decode "
                f"concurrency ({self.max_num_seqs}), so every step has room for prompt tokens"
            )
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_align = prefill_align
        self.start_in_decode = start_in_decode
        self.chunk_read_limit = chunk_read_limit
        self.max_num_prefill_seqs = max_num_prefill_seqs
        self.prefill_step_size = prefill_step_size
        self.kv = kv
        # Set by the engine's pacer (None: not paced): a step's tokens, and the prompt tokens
        # it may add beside decode rows (`MixedStepCap`).
        self.step_token_budget = self.decoding_prompt_budget = None
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        # No admission after `_unstarve` until a prompt progresses (else it takes back its blocks).
        self.admission_held = False

    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.num_unfinished > 0

    def _solo_active(self) -> bool:
        return any(not r.sampling_params.is_batchable for r in self.prefilling + self.running)

    def _admit(self) -> list[Request]:
        joining: list[Request] = []
        room = min(
            self.max_num_prefill_seqs - len(self.prefilling), self.max_num_seqs - len(self.running)
        )
        if self._solo_active() or self.admission_held:
            return joining
        while room > 0 and self.waiting:
            head = self.waiting[0]
            if not head.sampling_params.is_batchable:
                # Drain first: it joins only an empty engine, and alone.
                if self.prefilling or self.running or joining:
                    break
                room = 1
            if self.kv is not None and not self.kv.admit(head):
                break
            self.waiting.popleft()
            head.status = RequestStatus.PREFILLING
            joining.append(head)
            room -= 1
            if not head.sampling_params.is_batchable:
                break
        self.prefilling.extend(joining)
        return joining

    def schedule_decode(self) -> tuple[list[Request], list[Request]]:
        """The rows that decode one token this step, in batch order, and the requests preempted
        to make room for them (paged KV only)."""
        if self.kv is None:
            return list(self.running), []
        preempted: list[Request] = []
        rows: list[Request] = []
        for req in list(self.running):
            if req in preempted:
                continue
            while not self.kv.allocate_decode(req):
                victim = self.running[-1]
                self.preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                req.num_computed_tokens += 1
                rows.append(req)
        return rows, preempted

    def preempt(self, request: Request) -> None:
        """Free the request's blocks and put it back at the front of the queue (recompute;
        its computed blocks stay in the prefix cache, so it usually resumes from them)."""
        self.requeue([request], cache_computed=True)
        request.num_preemptions += 1

    def requeue(self, requests: list[Request], cache_computed: bool = False) -> None:
        """Put running or prefilling requests back at the front of the queue, in their order,
        to be recomputed from their tokens so far (after a failed step, whose K/V is not to
        be trusted, unless `cache_computed`)."""
        for request in reversed(requests):
            running = request in self.running
            if running:
                self.running.remove(request)
            else:
                self.prefilling.remove(request)
            if self.kv is not None:
                self.kv.free(request, cache_computed=cache_computed and running)
            request.num_computed_tokens = 0
            request.status = RequestStatus.WAITING
            self.waiting.appendleft(request)

    def schedule_prompts(self, num_decode_rows: int = 0) -> PromptSchedule:
        """Plan the step's prompt work and advance each prefilling `num_computed_tokens`;
        `num_decode_rows` (this step's, from `schedule_decode`) count against the budget."""
        out = PromptSchedule()
        if len(self.running) >= self.max_num_seqs:
            return out
        out.joining = self._admit()
        if not self.start_in_decode:
            out.starting = self._promote_starting()
            for req in out.starting:
                req.num_computed_tokens += 1

        # The budget guards decoding streams' pace: with none decoding, prompts take whole chunks.
        rows = num_decode_rows + len(out.starting)
        budget = self.max_num_batched_tokens if rows else None
        if budget is not None:
            budget -= rows
        if self.step_token_budget is not None:
            paced, share = max(self.step_token_budget - rows, MIN_TOKENS), self.prefill_align
            if rows and self.decoding_prompt_budget is not None:
                # Each chunk adds attention calls to the step's fixed cost: fewer, larger ones.
                paced = min(paced, self.decoding_prompt_budget)
                share = max(share, MIN_DECODING_SHARE)
            paced = paced if budget is None else min(budget, paced)
            out.prefill = self._shared_chunks(paced, share, self.chunk_read_limit if rows else None)
        else:
            out.prefill = self._budget_chunks(budget)
        if out.prefill or out.starting or self.running:
            self.admission_held = False
        self._unstarve(out)
        return out

    def _unstarve(self, out: PromptSchedule) -> None:
        """With nothing decoding and no chunk placed, prompts hold the pool while they wait for
        window blocks (`allocate_chunk`): the youngest goes back to the queue, freeing its."""
        if out.prefill or out.starting or self.running or len(self.prefilling) < 2:
            return
        if any(self._chunk_want(r) >= 1 for r in self.prefilling):
            victim = self.prefilling[-1]
            self.requeue([victim])
            self.admission_held = True
            if victim in out.joining:  # admitted this step: it never reaches the runner
                out.joining.remove(victim)

    def _budget_chunks(self, budget: int | None) -> list[tuple[Request, int]]:
        """Whole chunks in arrival order, within `budget` tokens (None: no budget)."""
        chunks = []
        for req in self.prefilling:
            n = self._chunk_want(req)
            if n < 1:  # only its last token left: it starts with the next step's decode
                continue
            if budget is not None:
                n = aligned_cut(req.num_computed_tokens, n, budget, self.prefill_align, not chunks)
                if n < 1:
                    break  # the step is full: the rest wait for the next one, in order
            if not self._chunk_fits(req, n):
                continue
            if budget is not None:
                budget -= n
            req.num_computed_tokens += n
            chunks.append((req, n))
        return chunks

    def _chunk_want(self, req: Request) -> int:
        # The last prompt token is kept back: it starts the request (see start_in_decode).
        return min(req.num_prefill_tokens - 1 - req.num_computed_tokens, self.prefill_step_size)

    def _shared_chunks(self, budget: int, min_share: int, reads: int | None):
        """Prompt chunks within a paced step's `budget`, granted by `shared_grants` in shares of
        at least `min_share`, and within `reads` where the step decodes (`within_row_reads`):
        its chunks then ride as decode rows; chunks cut short end on `prefill_align`."""
        wants = [(req, n) for req in self.prefilling if (n := self._chunk_want(req)) >= 1]
        if not wants:
            return []
        grants = shared_grants([n for _, n in wants], budget, min_share)
        if reads is not None:
            chunks = [(req.num_computed_tokens, g, n) for (req, n), g in zip(wants, grants)]
            grants = within_row_reads(chunks, reads, self.prefill_align)
        out = []
        for (req, n), grant in zip(wants, grants):
            if grant < n:
                grant = aligned_cut(req.num_computed_tokens, n, grant, self.prefill_align, not out)
            if grant >= 1 and self._chunk_fits(req, grant):
                req.num_computed_tokens += grant
                out.append((req, grant))
        return out

    def _chunk_fits(self, req: Request, n: int) -> bool:
        return self.kv is None or self.kv.allocate_chunk(req, n)

    def schedule_starting(self) -> list[Request]:
        """Requests whose prompt is computed but for its last token join the running batch
        (`start_in_decode`): `schedule_decode` then counts that token like a decode row's."""
        if len(self.running) >= self.max_num_seqs:
            return []
        return self._promote_starting()

    def _promote_starting(self) -> list[Request]:
        starting = [r for r in self.prefilling if r.num_prefill_tokens - r.num_computed_tokens == 1]
        if starting:
            moved = {id(r) for r in starting}
            self.prefilling = [r for r in self.prefilling if id(r) not in moved]
            for req in starting:
                req.status = RequestStatus.RUNNING
            self.running.extend(starting)
        return starting

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Retire a request (finished, aborted or failed) from whichever queue holds it."""
        request.status = status
        if self.kv is not None:
            # A decoding request's prompt and answer: the next turn of its conversation.
            self.kv.free(request, cache_computed=request in self.running)
        if request in self.running:
            self.running.remove(request)
        elif request in self.prefilling:
            self.prefilling.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
