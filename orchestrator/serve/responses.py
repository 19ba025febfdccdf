"""The bodies the server answers with: a chat.completion, its stream's chunks and the
`orchestra` field (money, time, turns, why it stopped, the trace) both carry."""
import json
import time

from orchestrator.serve.service import Job


def orchestra(rollout, job: Job) -> dict:
    """The response's extra top-level field: money, time, turns, why it stopped, the trace."""
    from evaluation.qa import rollout_record

    record = rollout_record(rollout)
    budget = job.budget.model_dump() if job.budget else None
    return {"stop_reason": rollout.stop_reason, "finished": rollout.finished, "dollars": record["cost"],
            "seconds": record["latency"], "wall_seconds": round(time.monotonic() - job.started, 3),
            "turns": len(rollout.turns), "tool_calls": record["tool_calls"], "tokens": record["tokens"],
            "budget": budget and {**budget, "stopped": rollout.stop_reason.startswith("budget")},
            "preference": job.preference.record() if job.preference else None, "trace": record["turns"]}


def usage(rollout) -> dict:
    """The orchestrator's own tokens, summed over its turns (experts' are in orchestra.tokens)."""
    prompt = sum(t.policy_usage.prompt_tokens for t in rollout.turns)
    completion = sum(t.policy_usage.completion_tokens for t in rollout.turns)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(rollout, job: Job, name: str) -> dict:
    return {"id": job.id, "object": "chat.completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": rollout.final_answer},
                         "finish_reason": "stop" if rollout.finished else "length"}],
            "usage": usage(rollout), "orchestra": orchestra(rollout, job)}


def chunk(job: Job, name: str, delta: dict | None, finish: str | None = None, **extra) -> str:
    body = {"id": job.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": name,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body, default=str)}\n\n"


def turn_text(record: dict) -> str:
    """A turn as the stream shows it: the orchestrator's text, then its call."""
    call = (f"{record['tool']}({record['alias']} -> {record['model']}): ${record['cost']:.6f}, "
            f"{record['latency']:.2f} s" if record["tool"] else "no tool call")
    problem = record["error"] or record["invalid_reason"]
    text = (record["reasoning"] or "").strip()
    return (f"{text}\n" if text else "") + f"[turn {record['index'] + 1}: {call}" + (f"; {problem}" if problem else "") + "]\n"


def episode_failed(rollout) -> str | None:
    return rollout.stop_reason if rollout.stop_reason.startswith("error") else None
