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

Rows with a grammar get a mask per query row, as if their draft were consumed (a draft is cut
before the first token its grammar refuses); the accepted tokens advance the matcher, so a
rejected draft leaves no trace in it. A speculative step must know each row's pending token
before it drafts, so it gives up the lookahead overlap; `SpeculationPolicy` compares the two
kinds of steps' token rates and backs off where drafts do not pay.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_paged.request import Request
from mlx_paged.runner.model_runner import RowOutput
from mlx_paged.sampling.sampler import sample
from mlx_paged.speculative.policy import SpeculationPolicy
from mlx_paged.structured.matchers import constrain


class SpeculativeDecoder:
    """Mixed into `PagedRunner` (which provides the lookahead state, `kv`, `grammars`,
    `_verify_logits` and `_written`); `proposer` None turns speculation off."""

    proposer = None
    spec_policy: SpeculationPolicy | None = None
    # Verify rows (rows with a draft), drafted tokens and accepted ones, since the start.
    spec_drafts = spec_draft_tokens = spec_accepted_tokens = 0

    def wants_speculation(self, rows: list[Request], allowed: bool = True) -> bool:
        """Whether this step speculates: a proposer, `allowed` (no prefill chunk rides in the
        forward), a pending token per row, and the policy's word; the policy is told the
        step's kind either way."""
        if self.proposer is None:
            return False
        speculative = (
            allowed and self.next_tokens is not None and self.spec_policy.choose(len(rows))
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
        drafts = self._drafts(rows, [[t] if id(r) in fresh else [] for r, t in zip(rows, pending)])
        allocated = [bool(d) for d in drafts]
        matchers = [r.runtime.active_matcher for r in rows]
        constrained = any(m is not None for m in matchers)
        if constrained:  # cuts drafts where their grammar refuses a token
            words = self.grammars.draft_masks(matchers, drafts)
        counts = np.array([1 + len(d) for d in drafts])
        index = np.repeat(np.arange(len(rows)), counts)
        # Query j of a row sits at position num_computed_tokens - 1 + j.
        lens = np.concatenate([r.num_computed_tokens + np.arange(c) for r, c in zip(rows, counts)])
        fed = [x for t, d in zip(pending, drafts) for x in (t, *d)]
        tokens = mx.array(fed, inputs.dtype)
        logits = self._verify_logits(tokens, index, lens.astype(np.int32))
        if constrained:
            logits = constrain(logits, mx.array(words))
        samplings = [rows[i].runtime.sampling for i in index]
        sampled, logprobs, contexts = sample(logits, tokens, samplings)
        mx.eval(sampled, contexts, self._written())
        accepted = self._accept(rows, drafts, sampled.tolist(), logprobs, counts, allocated)
        self._advance_matchers(accepted)
        return outputs + accepted

    def _drafts(self, rows: list[Request], tails: list[list[int]]) -> list[list[int]]:
        """Each row's draft, within its `max_tokens` (its pending token and the one after the
        draft come out too) and the room the pool has for it; none for rows whose sampling
        reads its own history (penalties, logit bias), whose grammar waits for its start, with
        a seed (drafts would change how many draws its output takes), or that turned
        speculation off."""
        limits = []
        for request, tail in zip(rows, tails):
            params, runtime = request.sampling_params, request.runtime
            free = not (runtime.sampling.processors or runtime.grammar_after)
            free = free and params.speculate and params.seed is None
            left = params.max_tokens - len(request.output_token_ids) - len(tail) - 1
            limits.append(left if free else 0)
        drafts = self.proposer.propose_batch(rows, tails, limits)
        for i, (request, draft) in enumerate(zip(rows, drafts)):
            if draft and self.kv.allocate_slots(request, len(draft)) is None:
                drafts[i] = []
        return drafts

    def _accept(self, rows, drafts, sampled: list[int], logprobs: mx.array, counts, allocated):
        """Keep each draft's prefix that the samples confirm; set the pending tokens; give back
        the blocks `allocated` for the rest. The accepted tokens as outputs."""
        outputs, pending, pending_logprobs = [], [], []
        at = 0
        for request, draft, count, took_blocks in zip(rows, drafts, counts, allocated):
            samples = sampled[at : at + count]
            accepted = 0
            while accepted < len(draft) and samples[accepted] == draft[accepted]:
                accepted += 1
            asks = request.sampling_params.logprobs
            outputs += [RowOutput(request, t, logprobs[at + j] if asks else None)
                        for j, t in enumerate(draft[:accepted])]  # fmt: skip
            pending.append(samples[accepted])
            pending_logprobs.append(logprobs[at + accepted] if asks else None)
            request.num_computed_tokens += accepted
            if took_blocks:
                self.kv.trim(request, request.num_computed_tokens)
            self.proposer.accept(request, request.num_computed_tokens)
            if draft:
                self.spec_drafts += 1
                self.spec_draft_tokens += len(draft)
                self.spec_accepted_tokens += accepted
            at += count
        self.next_tokens = mx.array(pending, self.next_tokens.dtype)
        self.next_logprobs = pending_logprobs
        return outputs
