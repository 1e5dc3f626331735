"""`draftsmith synth --endpoint` against a real OpenAI-compatible server: llama-cpp-python's
server (`python -m llama_cpp.server`) serving the embedded default's GGUF on CPU. Answers go
through /v1/chat/completions, Magpie self-prompts through /v1/completions, and a prompt longer
than the server's context is skipped and counted."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from draftsmith.assets import GSM8K_TRAIN
from draftsmith.cli import app
from draftsmith.target import resolve_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None,
        reason="llama-cpp-python is not installed (pip install 'llama-cpp-python[server]')",
    ),
]
N_CTX = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder, gguf = resolve_spec("smollm2-135m")
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_file = log.open("wb")  # a file, not a pipe: the server logs a lot and a full pipe blocks it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(folder / gguf),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            str(N_CTX),
            "--n_threads",
            str(min(2, os.cpu_count() or 1)),
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/models", timeout=2) as r:
                    name = json.loads(r.read())["data"][0]["id"]
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"llama_cpp.server exited: {log.read_text(errors='replace')[-2000:]}")
                if time.time() > deadline:
                    pytest.fail("llama_cpp.server did not become ready within 120 s")
                time.sleep(0.5)

        def why(output: str) -> str:
            """A failed command's output, and the server's exit and last log lines if it died (a
            crash in llama.cpp shows as 'connection refused' to the client)."""
            if proc.poll() is None:
                return output
            return (
                f"{output}\nllama_cpp.server exited with {proc.returncode}: {log.read_text(errors='replace')[-1000:]}"
            )

        yield url, name, why
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log_file.close()


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_chat_completions_against_llama_cpp_server(server, tmp_path):
    url, name, why = server
    prompts = tmp_path / "gsm8k.jsonl"
    long_prompt = json.dumps({"question": "Count the apples: " + "apple, " * 600, "answer": "many"})
    prompts.write_text("".join(GSM8K_TRAIN.read_text().splitlines(keepends=True)[:3]) + long_prompt + "\n")
    out = tmp_path / "remote" / "convs.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "synth",
            str(prompts),
            "--endpoint",
            url,
            "--out",
            str(out),
            "--max-new-tokens",
            "32",
            "--keep-unfinished",
            "--concurrency",
            "2",
            "--retries",
            "1",
            "--timeout",
            "120",
        ],
    )
    assert res.exit_code == 0, why(res.output)
    recs = _records(out)
    assert sorted(r["id"] for r in recs) == [f"gsm8k:line-{i}:s0" for i in (1, 2, 3)]
    for r in recs:
        assert r["model"] == name and r["generation"]["backend"] == "remote"
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] and r["messages"][1]["content"].strip()
        assert 0 < r["generated_tokens"] <= 32
    (dropped,) = _records(out.with_name("convs.dropped.jsonl"))
    assert len(dropped.pop("key")) == 24  # the resume key
    assert len(dropped.pop("repeat_key")) == 24  # the prompt's key under any file name
    assert dropped == {"id": "gsm8k:line-4:s0", "source_id": "line-4", "reason": "too_long", "rejected": "[assistant] "}
    assert (
        json.loads((out.parent / f"{out.stem}.synth" / "progress.json").read_text())["counters"]["dropped_too_long"]
        == 1
    )


def test_magpie_through_completions(server, tmp_path):
    url, _, why = server
    out = tmp_path / "magpie" / "convs.jsonl"
    res = CliRunner().invoke(
        app,
        [
            "synth",
            "--magpie",
            "3",
            "--endpoint",
            url,
            "--out",
            str(out),
            "--max-new-tokens",
            "40",
            "--keep-unfinished",
            "--concurrency",
            "2",
            "--seed",
            "2",
        ],
    )
    assert res.exit_code == 0, why(res.output)
    recs = _records(out)
    good = [
        r
        for r in recs
        if [m["role"] for m in r["messages"]] == ["user", "assistant"]
        and all(m["content"].strip() for m in r["messages"])
    ]
    assert len(good) >= 2, res.output
    assert all("<|im_" not in m["content"] for r in recs for m in r["messages"])
