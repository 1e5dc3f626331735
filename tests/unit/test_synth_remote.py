"""Remote backend contract: the requests sent to an OpenAI-compatible server and the parsing of
its answers, retries with backoff, context and usage errors, and an unreachable server, all
against an in-process stub server (the real llama.cpp server test is tests/e2e/test_synth_llama_server.py)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from draftsmith.cli import app
from draftsmith.errors import UserError
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.remote import RemoteBackend, ServerUnreachable, normalize_endpoint, parse_response
from draftsmith.synth.turns import Request

SAMPLING = Sampling(0.7, 0.9, 0, 24, 3)


class Stub:
    """An OpenAI-compatible server that records every request and answers from a script."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict | None]] = []
        self.errors: list[tuple[int, str]] = []  # forced (status, body) answers, served first
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, obj):
                data = json.dumps(obj).encode() if not isinstance(obj, str) else obj.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                stub.requests.append(("GET", self.path, None))
                self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append(("POST", self.path, body))
                    forced = stub.errors.pop(0) if stub.errors else None
                if forced:
                    return self._send(forced[0], forced[1])
                if self.path == "/v1/chat/completions":
                    last = body["messages"][-1]["content"]
                    msg = {"role": "assistant", "content": f"Answer to: {last}"}
                    return self._send(
                        200,
                        {
                            "model": "stub-model",
                            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 9, "completion_tokens": 5},
                        },
                    )
                n = len(stub.requests)
                self._send(
                    200,
                    {
                        "model": "stub-model",
                        "choices": [{"index": 0, "text": f" Question number {n}?", "finish_reason": "stop"}],
                        "usage": {"completion_tokens": 4},
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def posts(self, path):
        return [b for m, p, b in self.requests if m == "POST" and p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_request_format(stub):
    backend = RemoteBackend(stub.url.removesuffix("/v1"), concurrency=2, timeout=5, retries=0)
    assert backend.name == "stub-model" and stub.requests[0][:2] == ("GET", "/v1/models")
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi?"}]
    chat, comp = backend.generate(
        [Request("c/a0", messages=msgs), Request("m/u0", prefix="<|im_start|>user\n", stop=("<|im_end|>",))], SAMPLING
    )
    body = stub.posts("/v1/chat/completions")[0]
    assert body["model"] == "stub-model" and body["messages"] == msgs and body["max_tokens"] == 24
    assert body["temperature"] == 0.7 and body["top_p"] == 0.9 and isinstance(body["seed"], int) and "top_k" not in body
    cbody = stub.posts("/v1/completions")[0]
    assert cbody["prompt"] == "<|im_start|>user\n" and cbody["stop"] == ["<|im_end|>"] and "messages" not in cbody
    assert chat.text == "Answer to: Hi?" and chat.tokens == 5 and chat.finished
    assert comp.text.startswith(" Question number") and comp.tokens == 4


def test_response_parsing():
    cut = parse_response(
        {"choices": [{"message": {"content": "Half"}, "finish_reason": "length"}], "usage": {"completion_tokens": 7}}
    )
    assert cut.text == "Half" and not cut.finished and cut.tokens == 7
    think = parse_response(
        {"choices": [{"message": {"content": " 42", "reasoning_content": "2*21 "}, "finish_reason": "stop"}]}
    )
    assert think.text == "<think>\n2*21\n</think>\n\n42" and think.finished
    with pytest.raises(UserError, match="no choices"):
        parse_response({"error": "x"})
    assert normalize_endpoint("http://h:1/v1/") == normalize_endpoint("http://h:1") == "http://h:1/v1"


def test_retries_then_success_context_and_usage_errors(stub):
    backend = RemoteBackend(stub.url, model="m", timeout=5, retries=2, backoff=0.01)
    stub.errors = [(503, "busy"), (429, "slow down")]
    (gen,) = backend.generate([Request("a/a0", messages=[{"role": "user", "content": "x"}])], SAMPLING)
    assert gen.text == "Answer to: x" and len(stub.posts("/v1/chat/completions")) == 3
    stub.errors = [(400, '{"error": {"message": "This model\'s maximum context length is 2048 tokens"}}')]
    (gen,) = backend.generate([Request("b/a0", messages=[{"role": "user", "content": "y"}])], SAMPLING)
    assert gen.too_long and gen.text == ""
    stub.errors = [(404, '{"error": "model m not found"}')]
    with pytest.raises(UserError, match="HTTP 404.*not found"):
        backend.generate([Request("c/a0", messages=[{"role": "user", "content": "z"}])], SAMPLING)
    stub.errors = [(500, "down")] * 3
    with pytest.raises(ServerUnreachable, match="after 2 retries.*HTTP 500"):
        backend.generate([Request("d/a0", messages=[{"role": "user", "content": "w"}])], SAMPLING)


def _prompts(path, n):
    path.write_text("".join(json.dumps({"prompt": f"Prompt {i}"}) + "\n" for i in range(n)))
    return path


def test_cli_run_unreachable_keeps_output_and_resumes(stub, tmp_path):
    out = tmp_path / "remote" / "convs.jsonl"
    args = ["synth", "--out", str(out), "--retries", "1", "--backoff", "0.01", "--timeout", "5", "--concurrency", "2"]
    res = CliRunner().invoke(app, [*args, str(_prompts(tmp_path / "p.jsonl", 2)), "--endpoint", stub.url])
    assert res.exit_code == 0, res.output
    first = out.read_text()
    recs = [json.loads(line) for line in first.splitlines()]
    assert {r["id"] for r in recs} == {"p:line-1:s0", "p:line-2:s0"} and recs[0]["model"] == "stub-model"
    assert recs[0]["generation"]["backend"] == "remote"

    dead = f"http://127.0.0.1:{_free_port()}/v1"
    res = CliRunner().invoke(app, [*args, str(_prompts(tmp_path / "p.jsonl", 5)), "--endpoint", dead, "--model", "m"])
    assert res.exit_code == ServerUnreachable.exit_code, res.output
    assert (
        "no answer from the server after 1 retries" in res.output and "rerun the same command to resume" in res.output
    )
    assert out.read_text() == first  # the work done before is kept, untouched
    assert json.loads((out.parent / f"{out.stem}.synth" / "progress.json").read_text())["status"] == "failed"

    res = CliRunner().invoke(app, [*args, str(tmp_path / "p.jsonl"), "--endpoint", stub.url])
    assert res.exit_code == 0, res.output
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == [f"p:line-{i}:s0" for i in range(1, 6)]  # each exactly once
    assert len(stub.posts("/v1/chat/completions")) == 5
    # a rerun of a finished job has nothing to do: it does not even contact the server
    res = CliRunner().invoke(app, [*args, str(tmp_path / "p.jsonl"), "--endpoint", dead])
    assert res.exit_code == 0 and "5 conversations in the file" in res.output, res.output


def test_cli_magpie_uses_completions(stub, tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr("draftsmith.target.load_tokenizer", lambda *a, **k: tokenizer)
    out = tmp_path / "mp" / "convs.jsonl"
    res = CliRunner().invoke(app, ["synth", "--magpie", "3", "--turns", "2", "--endpoint", stub.url, "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 3 and all([m["role"] for m in r["messages"]] == ["user", "assistant"] * 2 for r in recs)
    prompts = [b["prompt"] for b in stub.posts("/v1/completions")]
    assert len(prompts) == 6 and all(p.endswith("<|im_start|>user\n") for p in prompts)
    assert sum("<|im_start|>assistant\nAnswer to: Question number" in p for p in prompts) == 3  # turn 2 sees turn 1
