"""One attempt: a model, one problem variant, one arm, one replicate, under a budget (docs/design.md section 5).

The loop is deliberately plain: ask the model, carry out what it asked, tell it what happened and what budget is
left, until it finishes or a budget ends it. The rules that keep paired arms comparable live here:

- budgets are identical for every arm; the wall clock counts the model's time and grading, never time spent
  queueing for a GPU slot;
- malformed replies (no action, bad JSON, unknown tools, empty code) are answered with the reason and cost a turn,
  never a submission;
- when the submissions or the wall clock run out, the model gets up to `WRAP_UP_TURNS` more turns in which it may
  only write SKILL.md and finish -- every arm alike, so the skill a transfer arm inherits is never cut off by the
  budget that ended its source;
- the final kernel is the one named in `finish`, else the best passing submission by speedup, else the last; it is
  re-graded in a fresh process on fresh draws and that grade is the attempt's.

Infrastructure failures (a provider outage that outlasts the retries, a grader that cannot start) raise
`InfraFailure`: the attempt is then not a result, and the scheduler retries it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metakernel.agents import prompts
from metakernel.agents.llm import LLMResponse, NonRetryableLLMError, RetriesExhaustedError
from metakernel.agents.tools import TOOLS, Request, from_text, from_tool_call

from metakernel.budget import Budget
from metakernel.executor import Executor, Graded
from metakernel.grader.report import GradeReport
from metakernel.plan import AttemptKey
from metakernel.problem import Problem
from metakernel.skills import cap_skill, lint_skill
from metakernel.store import Store
from metakernel.variants import task_text

WRAP_UP_TURNS = 2
INFRA_RETRIES = 2
#: Characters of conversation sent per call before old tool outputs and old kernels are trimmed (~50k tokens).
CONTEXT_CHARS = 200_000
#: Trimming goes this far below the limit, so that it happens every few turns, not every turn (prompt caching).
TRIM_TO = 0.7
_KEEP_RECENT = 6


class InfraFailure(Exception):
    """Not the model's doing: the attempt must be retried, not scored."""


@dataclass
class AttemptSetup:
    """Everything one attempt needs; built by the scheduler."""

    key: AttemptKey
    problem: Problem
    budget: Budget
    client: Any  # agents.models.CachedClient (complete(messages, tools, key=...))
    executor: Executor
    store: Store
    run_id: int
    docs: Any = None  # metakernel.docs_index.DocsIndex or None
    source_skill: str | None = None
    context_chars: int = CONTEXT_CHARS


@dataclass
class _Submission:
    n: int
    path: Path
    report: GradeReport


@dataclass
class _State:
    messages: list[dict[str, Any]] = field(default_factory=list)
    submissions: list[_Submission] = field(default_factory=list)
    checks: int = 0
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    unpriced: bool = False
    queue_s: float = 0.0
    wrap_up: str | None = None  # what ran out, once it has
    notes: list[str] = field(default_factory=list)  # budget notes waiting for the end of the current reply
    wrap_turns: int = 0
    finish: int | None = None
    ended_by: str | None = None
    trimmed_upto: int = 2  # messages[2:trimmed_upto] are sent trimmed (trim_context)


def _size(ms: list[dict[str, Any]]) -> int:
    return sum(len(m.get("content") or "") + sum(len(c["function"]["arguments"]) for c in m.get("tool_calls", ()))
               for m in ms)


def _trim_one(m: dict[str, Any]) -> int:
    """Replace a long tool output or old kernel by a note saying what it was (in place, on a copy).

    Returns the characters saved, so callers keep a running total instead of re-measuring the conversation.
    """
    saved = 0
    content = m.get("content") or ""
    if m["role"] in ("tool", "user") and isinstance(content, str) and len(content) > 300:
        m["content"] = f"[earlier output trimmed: {len(content)} characters]"
        saved += len(content) - len(m["content"])
    calls = m.get("tool_calls")
    if calls:
        new_calls = []
        for c in calls:
            args = c["function"]["arguments"]
            if len(args) > 300:
                short = json.dumps({"note": f"[earlier arguments trimmed: {len(args)} characters]"})
                saved += len(args) - len(short)
                c = {**c, "function": {**c["function"], "arguments": short}}
            new_calls.append(c)
        m["tool_calls"] = new_calls
    return saved


def trim_context(messages: list[dict[str, Any]], limit: int, upto: int = 2) -> tuple[list[dict[str, Any]], int]:
    """(what to send, the new `upto`): a copy of `messages` under `limit` characters, messages 2..upto-1 trimmed.

    Old tool outputs and old kernels go first; the system prompt and the task (with any transfer skill) are never
    touched, nor are the last few messages the model is reacting to. Trimmed items say what they were, so the
    model knows to look again if it needs to. `upto` only moves forward, and when the conversation outgrows
    `limit` it moves far enough to bring it down to TRIM_TO x `limit`: the messages the provider's prompt cache
    holds then stay byte-identical for the next several turns instead of changing at every turn.
    """
    upto = max(2, min(upto, len(messages)))
    total = _size(messages)
    if upto == 2 and total <= limit:
        return messages, upto
    out = [dict(m) for m in messages]
    for i in range(2, upto):
        total -= _trim_one(out[i])
    if total > limit:
        stop = max(2, len(out) - _KEEP_RECENT)
        while upto < stop and total > TRIM_TO * limit:
            total -= _trim_one(out[upto])
            upto += 1
    return out, upto


class Attempt:
    """Runs one attempt against the store; `run()` returns the result row for `Store.finish_attempt`."""

    def __init__(self, setup: AttemptSetup) -> None:
        self.s = setup
        self.id = setup.key.attempt_id
        self.dsl = setup.key.dsl
        self.dir = setup.store.attempt_dir(self.id)
        self.st = _State()
        self.try_no = 0
        self._t0 = 0.0

    # ------------------------------------------------------------------------------------------------ clocks
    def elapsed(self) -> float:
        """Budgeted seconds so far: wall clock minus time queued for a grading slot."""
        return time.monotonic() - self._t0 - self.st.queue_s

    def _budget_text(self) -> str:
        b = self.s.budget
        left = b.submissions - len(self.st.submissions)
        extra = ""
        if b.tokens:
            extra += f", {max(0, b.tokens - self.st.tokens_in - self.st.tokens_out)} tokens"
        if b.turns:
            extra += f", {max(0, b.turns - self.st.turns)} turns"
        return prompts.budget_line(left, (b.wall_s - self.elapsed()) / 60.0, extra)

    def _log(self, event: dict[str, Any]) -> None:
        self.s.store.append_transcript(self.id, event)

    # ------------------------------------------------------------------------------------------------ main loop
    async def run(self) -> dict[str, Any]:
        """The attempt from first prompt to final re-grade."""
        s, st = self.s, self.st
        self.try_no = s.store.start_attempt(self.id, s.run_id)
        self._t0 = time.monotonic()
        task = task_text(s.problem, self.dsl)
        if s.source_skill is not None:
            task += prompts.transfer_section(s.source_skill)
        task += "\n" + self._budget_text()
        st.messages = [{"role": "system", "content": prompts.SYSTEM}, {"role": "user", "content": task}]
        self._log({"type": "prompt", "attempt": self.id, "try": self.try_no, "system_sha256":
                   hashlib.sha256(prompts.SYSTEM.encode()).hexdigest(), "user": task})
        while st.ended_by is None:
            if self._out_of_budget():
                break
            response = await self._ask()
            if response is None:
                break
            await self._act(response)
        return await self._finish()

    def _out_of_budget(self) -> bool:
        """Decide before each model call: hard limits end the attempt, soft ones open the wrap-up turns."""
        st, b = self.st, self.s.budget
        hard = [("turns", b.turns is not None and st.turns >= b.turns),
                ("tokens", b.tokens is not None and st.tokens_in + st.tokens_out >= b.tokens),
                ("cost", b.cost_usd is not None and st.cost_usd >= b.cost_usd)]
        for name, hit in hard:
            if hit:
                st.ended_by = name
                return True
        if st.wrap_up is None and self.elapsed() >= b.wall_s:
            self._enter_wrap_up("wall clock", "wall")
        if st.wrap_up is not None:
            if st.wrap_turns >= WRAP_UP_TURNS:
                st.ended_by = st.wrap_up
                return True
            st.wrap_turns += 1
        return False

    def _enter_wrap_up(self, what: str, code: str) -> None:
        if self.st.wrap_up is None:
            self.st.wrap_up = code
            self.st.wrap_turns = 0
            note = prompts.WRAP_UP.format(what=what)
            # Not appended yet: tool results must follow the assistant message that asked for them directly.
            self.st.notes.append(note)
            self._log({"type": "budget", "text": note})

    async def _ask(self) -> LLMResponse | None:
        s, st = self.s, self.st
        turn = st.turns
        for note in st.notes:
            st.messages.append({"role": "user", "content": note})
        st.notes.clear()
        messages, st.trimmed_upto = trim_context(st.messages, s.context_chars, st.trimmed_upto)
        try:
            response: LLMResponse = await s.client.complete(messages, TOOLS, key=f"{self.id}#{turn}")
        except NonRetryableLLMError as exc:
            text = str(exc).lower()
            if "context" in text and ("window" in text or "length" in text):
                st.ended_by = "context_window"
                self._log({"type": "error", "turn": turn, "text": str(exc)})
                return None
            raise InfraFailure(f"model call failed: {exc}") from exc
        except RetriesExhaustedError as exc:
            raise InfraFailure(f"model unavailable: {exc}") from exc
        st.turns += 1
        st.tokens_in += response.prompt_tokens
        st.tokens_out += response.completion_tokens
        if response.cost_usd is None:
            st.unpriced = True
        else:
            st.cost_usd += response.cost_usd
        replayed = bool(getattr(s.client, "cache", None) is not None and s.client.cache.mode == "replay")
        s.store.record_llm_call(self.id, self.try_no, turn, s.client.spec.model, response, replayed)
        message: dict[str, Any] = {"role": "assistant", "content": response.content or ""}
        if response.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in response.tool_calls]
        st.messages.append(message)
        self._log({"type": "reply", "turn": turn, "content": response.content,
                   "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in response.tool_calls],
                   "prompt_tokens": response.prompt_tokens, "completion_tokens": response.completion_tokens,
                   "cost_usd": response.cost_usd, "latency_s": response.latency_s})
        return response

    async def _act(self, response: LLMResponse) -> None:
        st = self.st
        if response.tool_calls:
            for call in response.tool_calls:
                req = from_tool_call(call.id, call.name, call.arguments)
                text = await self._execute(req)
                st.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text})
                if st.ended_by is not None:
                    return
            return
        req = from_text(response.content or "")
        if req is None:
            st.messages.append({"role": "user", "content": prompts.NO_ACTION + "\n" + self._budget_text()})
            self._log({"type": "tool", "tool": None, "result": prompts.NO_ACTION})
            return
        text = await self._execute(req)
        st.messages.append({"role": "user", "content": f"Result of {req.tool}:\n{text}"})

    async def _execute(self, req: Request) -> str:
        """Carry out one request; the returned text (ending in the budget line) is what the model reads."""
        if req.error is not None:
            text = f"error: {req.error}"
        elif self.st.wrap_up is not None and req.tool in ("submit", "check", "docs_search", "docs_read"):
            text = "error: " + prompts.WRAP_UP.format(what="budget")
        else:
            handler = getattr(self, f"_tool_{req.tool}")
            text = await handler(req.args)
        if self.st.ended_by is None:
            text = f"{text}\n{self._budget_text()}"
        self._log({"type": "tool", "tool": req.tool, "args": {k: (v if k not in ("code", "content") else
                                                                 f"<{len(v)} chars>") for k, v in req.args.items()},
                   "result": text})
        return text

    # ------------------------------------------------------------------------------------------------ tools
    async def _grade(self, path: Path) -> Graded:
        """Grade with retries on the grader's own infrastructure failures (those never cost a submission)."""
        for attempt in range(INFRA_RETRIES + 1):
            graded = await self.s.executor.grade(self.s.problem, self.dsl, path)
            self.st.queue_s += graded.queue_s
            if graded.report.status != "infra_error":
                return graded
            self._log({"type": "infra", "text": f"grader infra_error (try {attempt + 1}): {graded.report.message}"})
        raise InfraFailure(f"grader infra_error {INFRA_RETRIES + 1} times: {graded.report.message[:500]}")

    async def _tool_submit(self, args: dict[str, Any]) -> str:
        code: str = args["code"]
        if not code.strip():
            return "error: the code is empty (no submission used)"
        n = len(self.st.submissions) + 1
        path = self.dir / f"kernel_v{n:02d}.py"
        path.write_text(code, encoding="utf-8")
        graded = await self._grade(path)
        self.st.submissions.append(_Submission(n, path, graded.report))
        self.s.store.record_submission(self.id, self.try_no, "submit", n, path, graded.report.kernel_sha256,
                                       graded.report.to_dict(), graded.queue_s, graded.grade_s)
        text = f"submission {n}: " + graded.report.agent_text()
        if n >= self.s.budget.submissions:
            self._enter_wrap_up("submission budget", "submissions")
        return text

    async def _tool_check(self, args: dict[str, Any]) -> str:
        code: str = args["code"]
        if not code.strip():
            return "error: the code is empty"
        self.st.checks += 1
        n = self.st.checks
        path = self.dir / "checks" / f"check_{n:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code, encoding="utf-8")
        started = time.monotonic()
        report = await self.s.executor.check(self.s.problem, self.dsl, path)
        self.s.store.record_submission(self.id, self.try_no, "check", n, path, report.kernel_sha256,
                                       report.to_dict(), 0.0, time.monotonic() - started)
        return "check: " + report.agent_text()

    async def _tool_docs_search(self, args: dict[str, Any]) -> str:
        if self.s.docs is None:
            return "the documentation index is not available in this run"
        dsl = args.get("dsl") or ""
        if dsl not in ("", "cute", "tirx"):
            dsl = ""
        return str(self.s.docs.search_text(args["query"], dsl))

    async def _tool_docs_read(self, args: dict[str, Any]) -> str:
        if self.s.docs is None:
            return "the documentation index is not available in this run"
        return str(self.s.docs.read(args["doc_id"]))

    async def _tool_write_skill(self, args: dict[str, Any]) -> str:
        capped = cap_skill(args["content"])
        findings = [{"code": f.code, "line": f.line, "message": f.message} for f in lint_skill(capped.text)]
        self.s.store.record_skill(self.id, capped.text, sha256=hashlib.sha256(capped.text.encode()).hexdigest(),
                                  original_bytes=capped.original_bytes, truncated=capped.truncated, lint=findings)
        text = f"SKILL.md saved ({len(capped.text.encode())} bytes)"
        if capped.truncated:
            text += f"; truncated from {capped.original_bytes} bytes to the 16 KB cap"
        return text

    async def _tool_finish(self, args: dict[str, Any]) -> str:
        n = int(args.get("submission") or 0)
        if n > len(self.st.submissions):
            return f"error: there is no submission {n} (you made {len(self.st.submissions)}); finish again"
        self.st.finish = n
        self.st.ended_by = "finish"
        return "finished"

    # ------------------------------------------------------------------------------------------------ ending
    def _final(self) -> _Submission | None:
        subs = self.st.submissions
        if not subs:
            return None
        if self.st.finish:
            return subs[self.st.finish - 1]
        passing = [x for x in subs if x.report.passed and x.report.speedup is not None]
        if passing:
            return max(passing, key=lambda x: x.report.speedup or 0.0)
        return subs[-1]

    async def _finish(self) -> dict[str, Any]:
        st, s = self.st, self.s
        final = self._final()
        result: dict[str, Any] = {
            "final_submission": final.n if final else None, "submissions": len(st.submissions),
            "checks": st.checks, "turns": st.turns, "tokens_in": st.tokens_in, "tokens_out": st.tokens_out,
            "cost_usd": None if st.unpriced else st.cost_usd, "cost_status": "unpriced" if st.unpriced else "priced",
            "ended_by": st.ended_by, "synthetic": int(s.executor.synthetic), "model": s.key.model,
            "address": s.key.address, "budget": s.budget.to_dict(),
        }
        if final is None:
            result.update(status="wrong", reason="no_submission", passed=0, speedup=None, speedup_gpu=None,
                          roofline_fraction=None)
        else:
            graded = await self._grade(final.path)
            report = graded.report
            s.store.record_submission(self.id, self.try_no, "final", final.n, final.path, report.kernel_sha256,
                                      report.to_dict(), graded.queue_s, graded.grade_s)
            result.update(status=report.status, reason=report.reason, passed=int(report.passed),
                          speedup=report.speedup if report.passed else None,
                          speedup_gpu=report.speedup_gpu if report.passed else None,
                          roofline_fraction=report.roofline_fraction if report.passed else None)
        result["wall_s"] = self.elapsed()
        result["queue_s"] = st.queue_s
        self._log({"type": "end", **{k: v for k, v in result.items() if k != "budget"}})
        return result


async def run_attempt(setup: AttemptSetup) -> dict[str, Any]:
    """Run one attempt and return its result row (the caller stores it); raises `InfraFailure`."""
    return await Attempt(setup).run()


__all__ = ["AttemptSetup", "InfraFailure", "run_attempt", "trim_context"]
