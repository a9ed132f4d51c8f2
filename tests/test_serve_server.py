"""The OpenAI-compatible server on 127.0.0.1 (a free port), driven by the official ``openai`` client
(streaming and not) and by raw HTTP for the malformed cases, the 429, a disconnect mid-stream, a
reliability run with disconnects and malformed requests, and SIGTERM draining a subprocess. Every
wait is bounded; every server is stopped."""
import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip("aiohttp")
openai = pytest.importorskip("openai")

from dispatch.serve import EngineConfig, LLMEngine, RequestParams  # noqa: E402
from dispatch.serve.server import Server, ServerThread  # noqa: E402
from dispatch_book.bench import serve_load  # noqa: E402

PROMPTS = ["def main(", "import os\n", "class Foo:", "for i in range(", "    return ", "x = [", "# compute",
           "with open(path) as f:\n"]


@pytest.fixture(scope="module")
def shipped():
    from dispatch.train import load

    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices; far faster on a shared, busy CPU
    yield load("cpu")
    torch.set_num_threads(n)


def start(loaded, **cfg):
    engine = LLMEngine(loaded.model, EngineConfig(**{"max_seqs": 8, "max_step_tokens": 32, **cfg}),
                       tokenizer=loaded.tokenizer)
    st = ServerThread(Server(engine, loaded.tokenizer, "cpu"))
    return st, st.start(), engine


@pytest.fixture(scope="module")
def server(shipped):
    st, port, engine = start(shipped)
    yield f"http://127.0.0.1:{port}", engine
    st.stop()


def raw(url, method, path, body=None, headers=None, timeout=30):
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    out = (r.status, dict(r.getheaders()), r.read())
    c.close()
    return out


def wait_until(cond, timeout=30.0):
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            return False
        time.sleep(0.02)
    return True


def test_openai_client_streaming_and_not(server, shipped):
    url, engine = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=60, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["cpu"]
    tok = shipped.tokenizer
    solo = LLMEngine(shipped.model, EngineConfig(max_seqs=1))
    for prompt in PROMPTS[:3]:
        ref = solo.generate([tok(prompt)["input_ids"]], RequestParams(max_tokens=12))[0]
        whole = client.completions.create(model="cpu", prompt=prompt, max_tokens=12, temperature=0)
        assert whole.choices[0].text == tok.decode(ref.tokens, skip_special_tokens=True)
        assert whole.choices[0].finish_reason == ref.finish_reason
        assert whole.usage.completion_tokens == len(ref.tokens)
        pieces = list(client.completions.create(model="cpu", prompt=prompt, max_tokens=12, temperature=0, stream=True))
        assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
        assert pieces[-1].choices[0].finish_reason == ref.finish_reason and len(pieces) == len(ref.tokens)
    ids = tok(PROMPTS[0])["input_ids"]  # a prompt of token ids, as the load generator sends
    assert client.completions.create(model="cpu", prompt=ids, max_tokens=12, temperature=0).choices[0].text == \
        client.completions.create(model="cpu", prompt=PROMPTS[0], max_tokens=12, temperature=0).choices[0].text
    stopped = client.completions.create(model="cpu", prompt=PROMPTS[3], max_tokens=30, temperature=0,
                                        stop=[whole.choices[0].text[3:5] or "x"])
    assert stopped.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("body,param,code", [
    (b"{broken", None, None),
    (b"[1]", None, None),
    (b'{"model": "gpt-4", "prompt": "x"}', "model", "model_not_found"),
    (b'{"model": "cpu", "prompt": "x", "max_tokens": 0}', "max_tokens", None),
    (b'{"model": "cpu", "prompt": "x", "max_tokens": 1000}', "max_tokens", "context_length_exceeded"),
    (b'{"model": "cpu", "prompt": ' + json.dumps(list(range(1, 200))).encode() + b"}", "prompt",
     "context_length_exceeded"),
    (b'{"model": "cpu", "prompt": "x", "tempreature": 0}', "tempreature", None),
    (b'{"model": "cpu", "prompt": [99999]}', "prompt", None),
    (b'{"model": "cpu", "prompt": "x", "n": 2}', "n", None),
    (b'{"model": "cpu", "prompt": "x", "logprobs": 9}', "logprobs", None),
])
def test_bad_requests_are_openai_400s(server, body, param, code):
    status, _, out = raw(server[0], "POST", "/v1/completions", body)
    err = json.loads(out)["error"]
    assert status == 400 and set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")


def test_logprobs_through_the_client(server):
    client = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="none", timeout=60, max_retries=0)
    whole = client.completions.create(model="cpu", prompt="def main(", max_tokens=8, temperature=0, logprobs=2)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == whole.usage.completion_tokens == 8
    assert all(len(t) == 2 and max(t.values()) == own for t, own in zip(lp.top_logprobs, lp.token_logprobs,
                                                                        strict=True))
    assert "".join(lp.tokens) == whole.choices[0].text and lp.text_offset[0] == 0
    pieces = list(client.completions.create(model="cpu", prompt="def main(", max_tokens=8, temperature=0,
                                            logprobs=2, stream=True))
    assert [p.choices[0].logprobs.token_logprobs[0] for p in pieces] == lp.token_logprobs


def test_openai_client_sees_the_errors(server):
    client = openai.OpenAI(base_url=f"{server[0]}/v1", api_key="none", timeout=30, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="x")
    status, _, out = raw(server[0], "GET", "/v1/nothing")
    assert status == 404 and "error" in json.loads(out)


def test_health_and_metrics(server):
    url, engine = server
    assert raw(url, "GET", "/health")[0] == 200
    status, headers, out = raw(url, "GET", "/metrics")
    text = out.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in ("dispatch_requests_waiting 0", "dispatch_requests_running 0", "dispatch_kv_blocks_used 0",
                 f"dispatch_kv_blocks_total {engine.alloc.num_blocks}", "dispatch_time_to_first_token_seconds_bucket",
                 'dispatch_time_per_output_token_seconds_bucket{le="+Inf"}', 'dispatch_requests_total{status="400"}'):
        assert name in text, name


def stream_open(url, body):
    """A streaming request whose response is left open: (connection, response) after the first event."""
    host, port = url.removeprefix("http://").split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")
    return c, r


def test_disconnect_mid_stream_frees_blocks_at_once(server):
    url, engine = server
    c, r = stream_open(url, {"model": "cpu", "prompt": "def main(", "max_tokens": 100, "temperature": 0,
                             "ignore_eos": True})
    assert engine.alloc.num_used > 0
    c.sock.close()  # the client goes away with ~99 tokens to go
    c.close()
    assert wait_until(lambda: engine.alloc.num_used == 0 and not engine.has_work(), timeout=10)


def test_a_slow_step_is_logged(server, monkeypatch, caplog):
    from dispatch.serve import loop

    url, engine = server
    monkeypatch.setattr(loop, "SLOW_STEP_S", 0.0)  # every step counts as slow
    with caplog.at_level("WARNING", logger="dispatch.serve"):
        status, _, _ = raw(url, "POST", "/v1/completions", json.dumps(
            {"model": "cpu", "prompt": "def main(", "max_tokens": 3, "temperature": 0, "ignore_eos": True}).encode())
    assert status == 200
    said = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(said) >= 3 and all("decode rows" in m and "prompt tokens" in m for m in said), said
    assert any(": 0 decode rows," in m for m in said) and any(": 1 decode rows, 0 prompt tokens" in m for m in said)


def test_a_failed_step_answers_every_request_and_never_hangs(shipped, monkeypatch, caplog):
    """A step that raises (a device fault): the request in it gets a 500, /health turns 503, and every
    request after it a 503 at once, including those queued while the step failed; the log says what
    the failed step held."""
    st, port, engine = start(shipped)
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"model": "cpu", "prompt": "def main(", "max_tokens": 4, "temperature": 0}).encode()
    try:
        assert raw(url, "POST", "/v1/completions", body)[0] == 200

        def fault(sched):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(engine.runner, "run", fault)
        with caplog.at_level("ERROR", logger="dispatch.serve"):
            status, _, out = raw(url, "POST", "/v1/completions", body, timeout=20)
        assert status == 500 and json.loads(out)["error"]["type"] == "server_error"
        assert any("held 0 decode rows" in r.exc_text and r.exc_text.rstrip().endswith("eager")
                   for r in caplog.records if r.exc_text), "the failed step's rows are logged, and how it ran"
        assert raw(url, "GET", "/health")[0] == 503
        t0 = time.perf_counter()
        for _ in range(3):
            status, _, out = raw(url, "POST", "/v1/completions", body, timeout=10)
            assert status == 503 and json.loads(out)["error"]["code"] == "engine_failed"
        fut = []  # an add that reaches the engine's queue after the failure is refused too
        engine_loop = st.server.loop_
        engine_loop.loop.call_soon_threadsafe(lambda: fut.append(asyncio.ensure_future(
            engine_loop.add([1, 2, 3], RequestParams(max_tokens=2)))))
        assert wait_until(lambda: fut and fut[0].done(), timeout=10), "a queued add is answered, not left waiting"
        assert isinstance(fut[0].exception(), RuntimeError) and "failed earlier" in str(fut[0].exception())
        assert time.perf_counter() - t0 < 10
    finally:
        st.stop()


def test_full_queue_answers_429_with_retry_after(shipped):
    st, port, engine = start(shipped, max_seqs=1, max_waiting=1)
    url = f"http://127.0.0.1:{port}"
    try:
        body = {"model": "cpu", "prompt": "def main(", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        a = stream_open(url, body)  # running
        b_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        b_conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        assert wait_until(lambda: len(engine.scheduler.waiting) == 1, timeout=10)  # waiting
        status, headers, out = raw(url, "POST", "/v1/completions", json.dumps(body).encode())
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert json.loads(out)["error"]["code"] == "queue_full"
        for c in (a[0], b_conn):
            c.close()
        assert wait_until(lambda: engine.alloc.num_used == 0 and not engine.has_work(), timeout=20)
    finally:
        st.stop()


def test_reliability_disconnects_and_malformed(shipped):
    """Hundreds of requests, ~10 % cut off mid-stream, ~5 % malformed: no 5xx, every malformed one a
    400, no block left held, every completed greedy request the text it gets alone."""
    st, port, engine = start(shipped, max_seqs=16, max_waiting=4096)
    url = f"http://127.0.0.1:{port}"
    tok = shipped.tokenizer
    reqs = [serve_load.Request(tok(PROMPTS[i % len(PROMPTS)])["input_ids"], 4 + i % 13) for i in range(240)]
    try:
        rep = asyncio.run(asyncio.wait_for(serve_load.reliability(url, "cpu", reqs, concurrency=24, seed=1), 240))
        assert not rep["problems"], rep["problems"][:5]
        assert not any(s >= 500 for s in rep["statuses"]) and rep["kinds"]["disconnect"] > 10
        assert rep["statuses"][400] == rep["kinds"]["malformed"] > 5
        assert wait_until(lambda: engine.alloc.num_used == 0 and not engine.has_work(), timeout=20)
        solo = LLMEngine(shipped.model, EngineConfig(max_seqs=1))
        want = {}
        for i, text in rep["texts"].items():
            key = (i % len(PROMPTS), reqs[i].max_tokens)
            if key not in want:
                out = solo.generate([reqs[i].prompt], RequestParams(max_tokens=reqs[i].max_tokens))[0]
                want[key] = tok.decode(out.tokens, skip_special_tokens=True)
            assert text == want[key], i
        assert len(rep["texts"]) > 150
    finally:
        st.stop()


def test_sigterm_drains_in_flight_requests_and_exits():
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "dispatch.serve", "--model", "cpu", "--port", "0", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        line = b""
        t0 = time.perf_counter()
        while b"listening on" not in line and time.perf_counter() - t0 < 120:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited before listening"
        url = line.decode().split("listening on ")[1].split()[0]
        c, r = stream_open(url, {"model": "cpu", "prompt": "def main(", "max_tokens": 40, "temperature": 0,
                                 "ignore_eos": True})
        proc.send_signal(signal.SIGTERM)
        rest = r.read().decode()  # the stream still runs to its end
        assert rest.rstrip().endswith("data: [DONE]") and '"finish_reason": "length"' in rest
        c.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
