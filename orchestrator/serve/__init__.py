"""Serve a trained orchestrator behind an OpenAI-compatible API (FastAPI + uvicorn).

    python -m orchestrator.serve --model NAME [--endpoint URL] [--profile NAME] [--section hle|frames]
        [--retriever URL | --index DIR] [--host 127.0.0.1] [--port 8080] [--concurrency N] [--queue N]
        [--request-timeout S]

The orchestrator is `--model` (a configs/models.yaml name; a checkpoint behind vLLM is `--endpoint
URL`), run as run_hle.py / run_frames.py run it: the same flags, the same profile section
(`--section`, default hle: `qa.hle` of configs/profiles/<profile>.yaml gives turns, tokens,
prompts, experts and retrieval), the same set-up (evaluation/qa_cli.py `resolve`, `build_setup`)
and the same loop (evaluation/qa.py `play`, orchestrator/loop.py).  Nothing here chooses a
budget or a prompt of its own.

POST /v1/chat/completions   the last user message is the task; the reply's message content is
    the loop's final answer (null when it stopped without one: finish_reason "length" and
    `orchestra.stop_reason` say why).  Extra body fields (the openai SDK's `extra_body`):
      preference  a preset (accuracy, cost, latency, balanced, avoid_tool:T, prefer_alias:A,
                  avoid_alias:A) or a weight vector ("accuracy=1,cost=0.5" or {"cost": 0.5}),
                  stated to the orchestrator in training's words (evaluation/preference.py)
      budget      {"dollars": D, "turns": N}: before each orchestrator turn the loop stops when
                  D dollars are spent or N turns taken (a turn under way finishes: the spend
                  can pass D by that turn's cost)
    `usage` counts the orchestrator's own tokens over its turns; `orchestra` has dollars,
    seconds (tool latency, the paper's), wall_seconds, turns, stop_reason, budget, preference and
    `trace` (per turn: tool, alias, model, cost, latency, error, tokens; evaluation's turn record).
    `stream: true`: server-sent chat.completion.chunk events, one per orchestrator turn (its
    text and call in `delta.reasoning_content`, the turn record in `orchestra.turn`), then the
    answer in `delta.content` with the finish reason, a last chunk with `usage` and
    `orchestra`, and `data: [DONE]`.  Other OpenAI fields (temperature, max_tokens...) are
    ignored: the profile decides them.
GET /v1/models; GET /health (liveness: ready, running, queued, limits, counts of finished
requests); GET /health/ready (readiness: 503 until the in-process models, loaded at start-up,
are in memory; chat requests get 503 until then too).

Limits: `--concurrency` episodes run at once (default: evaluation's, 1 for an in-process model),
`--queue` more wait; past that 503 with Retry-After.  A request not answered within
`--request-timeout` gets 504 (streams: an error event), and its episode stops within about a
second, its model call under way included (orchestrator/cancellation.py); so does the episode of
a client that disconnects, which frees its slot.  Bad input: 400/404/422 with one line naming the
field (a lone surrogate in any string included), never repeating more than 200 characters of it;
every error body, the body and header limits' included, is OpenAI's shape.

Files: schema.py (the request models and the error shape), service.py (the limits, admission and
one request's episode), responses.py (the reply and stream-chunk bodies), stream.py (the SSE body
and the waits on the client and the deadline), app.py (the FastAPI routes), cli.py (flags, set-up,
`main`, the in-thread server of the tests).
"""
from orchestrator.serve.app import create_app
from orchestrator.serve.cli import Background, build, build_parser, limits_from, main
from orchestrator.serve.service import ServeLimits, Served

__all__ = ["Background", "ServeLimits", "Served", "build", "build_parser", "create_app", "limits_from", "main"]
