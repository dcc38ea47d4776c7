"""--speculative-config as vLLM takes it; each bad value refused naming its field."""

from __future__ import annotations

import pytest

from argosy.server.exceptions import InvalidRequestError
from argosy.server.spec_decode.config import SpeculativeConfig


def test_ngram_bounds_default_as_vllms():
    parse = SpeculativeConfig.parse
    assert parse('{"method": "ngram", "num_speculative_tokens": 4}') == SpeculativeConfig("ngram", 4, 5, 5)
    assert parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}).prompt_lookup_min == 4
    assert parse({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}).prompt_lookup_max == 2
    draft = parse({"method": "draft_model", "num_speculative_tokens": 3, "model": "/models/small"})
    assert draft.model == "/models/small"
    assert parse(None) is None


@pytest.mark.parametrize(
    "value, param",
    [
        ("{not json", "speculative_config"),
        ("[1]", "speculative_config"),
        ({"method": "eagle", "num_speculative_tokens": 3}, "speculative_config.method"),
        ({"method": "ngram"}, "speculative_config.num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": True}, "speculative_config.num_speculative_tokens"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "speculative_config.prompt_lookup_min",
        ),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "speculative_config.model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "/m"}, "speculative_config.model"),
        ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "speculative_config.typo"),
    ],
)
def test_bad_values_name_their_field(value, param):
    with pytest.raises(InvalidRequestError) as err:
        SpeculativeConfig.parse(value)
    assert err.value.param == param
