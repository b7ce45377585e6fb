"""The engine process sends `CoreOutput`s to the front pickled by their own `__reduce__`."""

import dataclasses
import pickle

from mlx_paged.engine.outputs import CoreOutput


def test_every_field_survives_the_trip_between_processes():
    values = {"request_id": "r-1", "token_id": 7, "finish_reason": "stop", "logprob": -0.25,
              "top_logprobs": [(7, -0.25), (3, -1.5)], "num_prompt_tokens": 11,
              "num_generated_tokens": 4, "num_cached_tokens": 8, "error": "boom"}  # fmt: skip
    # A field added to the class without a value here (or in `__reduce__`) fails this test.
    assert {f.name for f in dataclasses.fields(CoreOutput)} == set(values)
    out = CoreOutput(**values)
    assert pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)) == out
