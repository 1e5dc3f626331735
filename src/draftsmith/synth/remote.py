"""Remote backend: any OpenAI-compatible server (vLLM, SGLang, llama.cpp, ...).

Answers go to `POST {endpoint}/chat/completions`; Magpie's self-prompts go to
`POST {endpoint}/completions` with the rendered template prefix as the raw prompt and the
template's end-of-turn marker as the stop string. Requests run on a thread pool
(`--concurrency` in flight, over one httpx2 connection pool), each with a timeout; connection
errors, timeouts, HTTP 429 and 5xx are retried by tenacity with exponential backoff. A prompt
the server rejects as longer than its context counts as too long; any other 4xx is a usage
error and stops the run at once.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential, wait_random

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

    capture_seconds = 0.0  # the server's own graphs are not ours to time
    decoding = "an OpenAI-compatible server"

    def __init__(
        self,
        endpoint: str,
        model: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
        retries: int = 5,
        backoff: float = 1.0,
    ) -> None:
        self.base = normalize_endpoint(endpoint)
        self.concurrency, self.timeout, self.retries, self.backoff = concurrency, timeout, retries, backoff
        self.name = model or self.served_model()

    # -- HTTP ------------------------------------------------------------------------------
    def client(self) -> httpx2.Client:
        """A connection pool for `concurrency` requests in flight."""
        return httpx2.Client(
            timeout=self.timeout,
            limits=httpx2.Limits(max_connections=self.concurrency),
            headers={"Accept": "application/json"},
        )

    def _call(self, client: httpx2.Client, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = self.base + path
        try:
            resp = client.request(method, url, json=body)
        except httpx2.TransportError as e:  # no connection, a timeout, a dropped answer
            raise _Retryable(f"{url}: {e or type(e).__name__}") from None
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code} from {url}: {resp.text[:500]}")
        if resp.status_code >= 400:
            detail = resp.text[:500]
            if resp.status_code == 400 and any(h in detail.lower() for h in CONTEXT_HINTS):
                raise ContextError(detail)
            raise UserError(f"the server at {self.base} rejected {method} {path} (HTTP {resp.status_code}): {detail}")
        try:
            return resp.json()
        except ValueError as e:
            raise _Retryable(f"{url}: the answer is not JSON ({e})") from None

    def request(
        self, client: httpx2.Client, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`_call` with `retries` retries and exponential backoff with jitter (`backoff` seconds,
        doubled each retry, at most MAX_DELAY); raises ServerUnreachable."""
        retrying = Retrying(
            retry=retry_if_exception_type(_Retryable),
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff, max=MAX_DELAY) + wait_random(0, self.backoff / 4),
            reraise=True,
        )
        try:
            return retrying(self._call, client, method, path, body)
        except _Retryable as e:
            raise ServerUnreachable(f"no answer from the server after {self.retries} retries: {e}") from None

    def served_model(self) -> str:
        """The first model the server lists at GET /v1/models."""
        with self.client() as client:
            models = self.request(client, "GET", "/models").get("data") or []
        if not models:
            raise UserError(f"the server at {self.base} lists no models; pass --model NAME")
        return str(models[0]["id"])

    # -- generation --------------------------------------------------------------------------
    def _body(self, request: Request, sampling: Sampling) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.name,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": stable_seed(sampling.seed, request.key),
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k  # vLLM / SGLang / llama.cpp extension
        if request.prefix is not None:
            return "/completions", {**body, "prompt": request.prefix, "stop": list(request.stop)}
        return "/chat/completions", {**body, "messages": request.messages}

    def generate_one(self, client: httpx2.Client, request: Request, sampling: Sampling) -> Generation:
        path, body = self._body(request, sampling)
        try:
            resp = self.request(client, "POST", path, body)
        except ContextError:
            return Generation("", 0, finished=False, too_long=True)
        return parse_response(resp)

    def generate(self, requests: list[Request], sampling: Sampling) -> list[Generation]:
        with (
            self.client() as client,
            ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="synth") as pool,
        ):
            futures = [pool.submit(self.generate_one, client, r, sampling) for r in requests]
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
