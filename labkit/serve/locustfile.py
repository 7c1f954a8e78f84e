"""Locust users for labkit's server (or any OpenAI-compatible one): ``labkit.serve.loadgen.run_locust`` runs it.

Each user sends non-streaming requests back to back, a prompt from data/prompts.json at a time; Locust
times the whole response. Settings come from the environment (run_locust sets them):
LABKIT_LOCUST_MAX_TOKENS (tokens per request, default 16), LABKIT_LOCUST_ENDPOINT (completions | chat),
LABKIT_LOCUST_MODEL (model name to send; default: none, which labkit's server accepts).

By hand:  locust -f labkit/serve/locustfile.py --headless -u 8 -r 8 --run-time 20s --host http://127.0.0.1:8000
"""
from __future__ import annotations

import os
import random

from locust import HttpUser, constant, task

from labkit.model.prompts import (
    load_prompts,  # absolute: locust loads this file by path
)

PROMPTS = load_prompts("prompts")
MAX_TOKENS = int(os.environ.get("LABKIT_LOCUST_MAX_TOKENS", "16"))
ENDPOINT = os.environ.get("LABKIT_LOCUST_ENDPOINT", "completions")
MODEL = os.environ.get("LABKIT_LOCUST_MODEL") or None
if ENDPOINT not in ("completions", "chat"):
    raise ValueError(f"LABKIT_LOCUST_ENDPOINT={ENDPOINT!r}: choose 'completions' or 'chat'")


class CompletionUser(HttpUser):
    wait_time = constant(0)  # a closed loop: the next request leaves when the answer is in

    @task
    def complete(self) -> None:
        prompt = random.choice(PROMPTS)
        body: dict = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
        if MODEL:
            body["model"] = MODEL
        if ENDPOINT == "chat":
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
        else:
            path, body["prompt"] = "/v1/completions", prompt
        with self.client.post(path, json=body, catch_response=True, name=path) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            try:
                tokens = resp.json()["usage"]["completion_tokens"]
            except (ValueError, KeyError, TypeError) as exc:
                resp.failure(f"not an OpenAI completion: {exc}")
                return
            if tokens != MAX_TOKENS:
                resp.failure(f"{tokens} tokens, asked for {MAX_TOKENS}")
            else:
                resp.success()
