"""Remote backend: any OpenAI-compatible server (vLLM, SGLang, llama.cpp, ...).

Answers go to `POST {endpoint}/chat/completions`; Magpie's self-prompts go to
`POST {endpoint}/completions` with the rendered template prefix as the raw prompt and the
template's end-of-turn marker as the stop string. Requests run on a thread pool
(`--concurrency` in flight), each with a timeout; connection errors, timeouts, HTTP 429 and
5xx are retried with exponential backoff. A prompt the server rejects as longer than its
context counts as too long; any other 4xx is a usage error and stops the run at once.

Only the standard library is used (urllib + concurrent.futures): no extra dependency.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from draftsmith.errors import StageFailed, UserError
from draftsmith.runtime.sampling import Sampling
from draftsmith.synth.turns import Generation, Request, stable_seed

CONTEXT_HINTS = ("context", "too long", "maximum", "exceed", "too many tokens")
MAX_DELAY = 30.0


class ServerUnreachable(StageFailed):
    """The server did not answer after all retries."""


class _Retryable(Exception):
    """A failure worth retrying: no connection, a timeout, HTTP 429 or 5xx."""


class ContextError(Exception):
    """The server refused the prompt as longer than its context."""


def normalize_endpoint(url: str) -> str:
    """`http://host:port` or `http://host:port/v1` (trailing slash or not) -> `.../v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class RemoteBackend:
    """A client for one OpenAI-compatible server."""

    def __init__(self, endpoint: str, model: str | None = None, concurrency: int = 16, timeout: float = 120.0,
                 retries: int = 5, backoff: float = 1.0) -> None:
        self.base = normalize_endpoint(endpoint)
        self.concurrency, self.timeout, self.retries, self.backoff = concurrency, timeout, retries, backoff
        self.name = model or self.served_model()

    # -- HTTP ------------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if e.code == 429 or e.code >= 500:
                raise _Retryable(f"HTTP {e.code} from {self.base + path}: {detail}") from None
            if e.code == 400 and any(h in detail.lower() for h in CONTEXT_HINTS):
                raise ContextError(detail) from None
            raise UserError(f"the server at {self.base} rejected {method} {path} (HTTP {e.code}): {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            raise _Retryable(f"{self.base + path}: {getattr(e, 'reason', e)}") from None
        except json.JSONDecodeError as e:
            raise _Retryable(f"{self.base + path}: the answer is not JSON ({e.msg})") from None

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """`_call` with retries and exponential backoff (with jitter); raises ServerUnreachable."""
        for attempt in range(self.retries + 1):
            try:
                return self._call(method, path, body)
            except _Retryable as e:
                last = str(e)
                if attempt < self.retries:
                    time.sleep(min(self.backoff * 2**attempt, MAX_DELAY) * random.uniform(0.8, 1.2))
        raise ServerUnreachable(f"no answer from the server after {self.retries} retries: {last}")

    def served_model(self) -> str:
        """The first model the server lists at GET /v1/models."""
        models = self.request("GET", "/models").get("data") or []
        if not models:
            raise UserError(f"the server at {self.base} lists no models; pass --model NAME")
        return str(models[0]["id"])

    # -- generation --------------------------------------------------------------------------
    def _body(self, request: Request, sampling: Sampling) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.name, "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "seed": stable_seed(sampling.seed, request.key),
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k  # vLLM / SGLang / llama.cpp extension
        if request.prefix is not None:
            return "/completions", {**body, "prompt": request.prefix, "stop": list(request.stop)}
        return "/chat/completions", {**body, "messages": request.messages}

    def generate_one(self, request: Request, sampling: Sampling) -> Generation:
        path, body = self._body(request, sampling)
        try:
            resp = self.request("POST", path, body)
        except ContextError:
            return Generation("", 0, finished=False, too_long=True)
        return parse_response(resp)

    def generate(self, requests: list[Request], sampling: Sampling) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="synth") as pool:
            futures = [pool.submit(self.generate_one, r, sampling) for r in requests]
            try:
                return [f.result() for f in futures]
            except BaseException:
                for f in futures:
                    f.cancel()
                raise


def parse_response(resp: dict[str, Any]) -> Generation:
    """One OpenAI chat or text completion -> Generation. A separate reasoning field (vLLM and
    SGLang reasoning parsers) is put back in front of the answer as a `<think>` block."""
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise UserError(f"the server's answer has no choices: {json.dumps(resp)[:300]}") from None
    if "message" in choice:
        message = choice["message"] or {}
        text = message.get("content") or ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            text = f"<think>\n{reasoning.strip()}\n</think>\n\n{text.lstrip()}"
    else:
        text = choice.get("text") or ""
    usage = resp.get("usage") or {}
    tokens = int(usage.get("completion_tokens") or 0)
    return Generation(text, tokens, finished=choice.get("finish_reason") != "length")
