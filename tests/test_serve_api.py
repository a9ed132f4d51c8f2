"""The server's pieces without HTTP: the request parser's rules, streamed text held back while a stop
string or a character could still change it, and the Prometheus histogram by hand."""
import json

import pytest

from dispatch.serve import api
from dispatch.serve.metrics import Histogram, Metrics


def parse(body, **kw):
    args = dict(model="m", encode=lambda s: [ord(c) % 50 for c in s], vocab_size=50, context=32)
    return api.parse_completion(json.dumps(body).encode(), **{**args, **kw})


def test_parse_defaults_and_fields():
    p = parse({"model": "m", "prompt": "abc"})
    assert p.prompt_ids == [47, 48, 49] and not p.stream and p.params.max_tokens == 16
    assert p.params.temperature == 1.0 and p.params.top_p == 1.0 and p.params.logprobs is None
    p = parse({"model": "m", "prompt": [1, 2], "max_tokens": 3, "temperature": 0, "stop": "x", "seed": 7,
               "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "logprobs": 2})
    assert p.prompt_ids == [1, 2] and p.stream and p.include_usage and p.params.stop == ("x",)
    assert (p.params.seed, p.params.ignore_eos, p.params.logprobs, p.params.greedy) == (7, True, 2, True)


@pytest.mark.parametrize("body,param", [
    ({"model": "m", "prompt": "a", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "a", "max_tokens": 2.5}, "max_tokens"),
    ({"model": "m", "prompt": "a", "max_tokens": 40}, "max_tokens"),
    ({"model": "m", "prompt": "a" * 32}, "prompt"),
    ({"model": "m", "prompt": ["a"]}, "prompt"),
    ({"model": "m", "prompt": [1, 50]}, "prompt"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "x", "prompt": "a"}, "model"),
    ({"model": "m", "prompt": "a", "top_p": 0}, "top_p"),
    ({"model": "m", "prompt": "a", "temperature": -1}, "temperature"),
    ({"model": "m", "prompt": "a", "stop": ["a"] * 5}, "stop"),
    ({"model": "m", "prompt": "a", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "a", "echo": True}, "echo"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
])
def test_bad_fields_name_the_param(body, param):
    with pytest.raises(api.APIError) as e:
        parse(body)
    assert e.value.status == 400 and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_text_stream_holds_back_a_stop_string_and_half_characters():
    pieces = {(1,): "ab", (1, 2): "abXY", (1, 2, 3): "abXYZ!", (1, 2, 3, 4): "abXYZ!\ufffd"}
    ts = api.TextStream(lambda toks: pieces[tuple(toks)], stop=("XYZ",))
    assert ts.push([1]) == ""  # two characters held: they could start "XYZ"
    assert ts.push([1, 2]) == "ab"
    assert ts.push([1, 2, 3], stop_at=2) == ""  # the stop string matched at 2: nothing past it is sent
    ts = api.TextStream(lambda toks: pieces[tuple(toks)], stop=())
    assert ts.push([1, 2, 3]) == "abXYZ!" and ts.push([1, 2, 3, 4]) == ""  # a character still being decoded
    assert ts.push([1, 2, 3, 4], final=True) == "\ufffd"


def test_histogram_and_metrics_by_hand():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    assert h.lines("x") == ['x_bucket{le="0.1"} 2', 'x_bucket{le="1.0"} 3', 'x_bucket{le="+Inf"} 4', "x_sum 3.65",
                            "x_count 4"]
    with pytest.raises(ValueError, match="increasing"):
        Histogram((1.0, 0.5))
    m = Metrics()
    m.count("200")
    m.finished(5, [1.0, 1.5, 2.0], arrival=0.5)  # TTFT 0.5 s, TPOT 0.5 s
    text = m.render({"waiting": 1, "running": 2, "blocks_used": 3, "blocks_total": 4, "prefix_hit_tokens": 0})
    for line in ("dispatch_requests_waiting 1", "dispatch_kv_blocks_total 4", 'dispatch_requests_total{status="200"} 1',
                 "dispatch_generated_tokens_total 3", "dispatch_time_to_first_token_seconds_sum 0.5",
                 "dispatch_time_per_output_token_seconds_count 1"):
        assert line in text.splitlines(), line
