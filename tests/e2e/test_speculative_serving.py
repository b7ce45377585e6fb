"""`mlx-paged serve --draft-model ngram` through the real server and the `openai` client: the
same greedy text as plain decoding, a request may turn drafts off, and `/metrics` counts
verify rows, drafted and accepted tokens."""

from __future__ import annotations

import urllib.request

import pytest
from server_process import start_server
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]


@pytest.fixture(scope="module")
def speculating(tmp_path_factory):
    folder = build_model(tmp_path_factory.mktemp("spec") / "m", "llama")
    server = start_server(folder.parent, "--model", str(folder), "--draft-model", "ngram",
                          "--num-draft-tokens", "3", "--log-level", "WARNING")  # fmt: skip
    yield server, folder
    assert server.stop() == 0, server.log()


def test_greedy_text_equals_plain_decoding_and_metrics_count_drafts(speculating):
    from openai import OpenAI

    server, folder = speculating
    plain = LLM(str(folder), num_blocks=64).generate([PROMPT], SamplingParams(max_tokens=40))[0]
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for speculate in (True, False):
        reply = client.completions.create(
            model="default",
            prompt=PROMPT,
            max_tokens=40,
            temperature=0,
            extra_body={"speculate": speculate},
        )
        assert reply.choices[0].text == plain.text
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        metrics = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                       if line.startswith("mlx_paged_spec_"))  # fmt: skip
    names = {"drafts", "draft_tokens", "accepted_tokens"}
    assert set(metrics) == {f"mlx_paged_spec_{n}_total" for n in names}
    assert int(metrics["mlx_paged_spec_draft_tokens_total"]) >= int(
        metrics["mlx_paged_spec_accepted_tokens_total"]
    )


def test_a_bad_speculate_value_is_a_400(speculating):
    from openai import BadRequestError, OpenAI

    server, _ = speculating
    client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    with pytest.raises(BadRequestError, match="speculate must be a boolean"):
        client.completions.create(model="default", prompt=PROMPT, max_tokens=4,
                                  extra_body={"speculate": "yes"})  # fmt: skip
