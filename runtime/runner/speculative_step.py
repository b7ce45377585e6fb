"""Speculative decode steps on the paged path: each row feeds its pending token and a draft of
up to K more (prompt lookup, `speculative/ngram.py`), every one a query row of its own over the
request's pages, so one decode forward verifies them all.

Verification samples every position with the row's own sampler and keeps the drafted tokens
while they equal what was sampled before them; the first sample that differs (or the one after
the whole draft) becomes the row's pending token. A deterministic draft accepted exactly when
the target's own sample equals it is speculative sampling's rule for a one-point draft
distribution (accept with probability p(d), else draw from p without d), so greedy output is
plain decoding's and sampled output follows the target distribution. The K/V written for
rejected tokens is dropped: the row's length counts only accepted tokens, blocks past it go
back to the pool, and the prefix cache hashes only known tokens.

A speculative step must know each row's pending token before it drafts, so it gives up the
lookahead overlap; `SpeculationPolicy` compares the two kinds of steps' token rates and backs
off where drafts do not pay.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_paged.request import Request
from mlx_paged.runner.model_runner import RowOutput
from mlx_paged.sampling.sampler import sample
from mlx_paged.speculative.policy import SpeculationPolicy


class SpeculativeDecoder:
    """Mixed into `PagedRunner` (which provides the lookahead state, `kv`, `_verify_logits`
    and `_written`); `proposer` None turns speculation off."""

    proposer = None
    spec_policy: SpeculationPolicy | None = None
    # Verify rows (rows with a draft), drafted tokens and accepted ones, since the start.
    spec_drafts = spec_draft_tokens = spec_accepted_tokens = 0

    def wants_speculation(self, rows: list[Request]) -> bool:
        """Whether this step speculates: a proposer, no grammar row (masks per draft position
        are not built), a pending token per row, and the policy's word; the policy is told
        the step's kind either way."""
        if self.proposer is None:
            return False
        speculative = (
            self.next_tokens is not None
            and not any(r.runtime.matcher is not None for r in rows)
            and self.spec_policy.choose(len(rows))
        )
        self.spec_policy.begin(speculative, len(rows))
        return speculative

    def speculative_step(self, rows: list[Request]) -> list[RowOutput]:
        """Feed each row's pending token and its draft, verify the drafts, and return the fed
        tokens with the accepted ones (each request's in order)."""
        if [r.request_id for r in rows] != [r.request_id for r in self.decode_rows]:
            raise RuntimeError("decode rows differ from the runner's batch order")
        inputs, current_logprobs = self.next_tokens, self.next_logprobs
        outputs = self._fed_outputs(rows, inputs, current_logprobs)
        fresh = {id(o.request) for o in outputs}  # pending tokens not yet in their requests
        pending = inputs.tolist()
        drafts = [self._draft(r, [t] if id(r) in fresh else []) for r, t in zip(rows, pending)]
        counts = np.array([1 + len(d) for d in drafts])
        index = np.repeat(np.arange(len(rows)), counts)
        # Query j of a row sits at position num_computed_tokens - 1 + j.
        lens = np.concatenate([r.num_computed_tokens + np.arange(c) for r, c in zip(rows, counts)])
        fed = [x for t, d in zip(pending, drafts) for x in (t, *d)]
        tokens = mx.array(fed, inputs.dtype)
        logits = self._verify_logits(tokens, index, lens.astype(np.int32))
        samplings = [rows[i].runtime.sampling for i in index]
        sampled, logprobs, contexts = sample(logits, tokens, samplings)
        mx.eval(sampled, contexts, self._written())
        return outputs + self._accept(rows, drafts, sampled.tolist(), logprobs, counts)

    def _draft(self, request: Request, tail: list[int]) -> list[int]:
        """The request's draft, within its `max_tokens` (the pending token and the one after
        the draft come out too) and the room the pool has for it; none for rows whose sampling
        reads its own history (penalties, logit bias) or that turned speculation off."""
        params = request.sampling_params
        if request.runtime.sampling.processors or not params.speculate:
            return []
        limit = params.max_tokens - len(request.output_token_ids) - len(tail) - 1
        draft = self.proposer.propose(request, tail, limit)
        if draft and self.kv.allocate_slots(request, len(draft)) is None:
            return []
        return draft

    def _accept(self, rows, drafts, sampled: list[int], logprobs: mx.array, counts):
        """Keep each draft's prefix that the samples confirm; set the pending tokens; trim the
        K/V of the rest. The accepted tokens as outputs."""
        outputs, pending, pending_logprobs = [], [], []
        at = 0
        for request, draft, count in zip(rows, drafts, counts):
            samples = sampled[at : at + count]
            accepted = 0
            while accepted < len(draft) and samples[accepted] == draft[accepted]:
                accepted += 1
            asks = request.sampling_params.logprobs
            outputs += [RowOutput(request, t, logprobs[at + j] if asks else None)
                        for j, t in enumerate(draft[:accepted])]  # fmt: skip
            pending.append(samples[accepted])
            pending_logprobs.append(logprobs[at + accepted] if asks else None)
            if draft:
                request.num_computed_tokens += accepted
                self.kv.trim(request, request.num_computed_tokens)
                self.spec_drafts += 1
                self.spec_draft_tokens += len(draft)
                self.spec_accepted_tokens += accepted
            at += count
        self.next_tokens = mx.array(pending, self.next_tokens.dtype)
        self.next_logprobs = pending_logprobs
        return outputs
