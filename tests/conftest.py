"""Opt-in markers: `gpu`, `llm_local` and `slow` tests run only when asked for, and say why they skipped."""

from __future__ import annotations

import pytest

OPT_IN = {
    "gpu": ("--gpu", "needs a CUDA GPU: pass --gpu on a machine with one"),
    "llm_local": ("--llm-local", "starts a local llama.cpp server: pass --llm-local"),
    "slow": ("--slow", "takes minutes: pass --slow"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    for marker, (flag, _) in OPT_IN.items():
        parser.addoption(flag, action="store_true", default=False, help=f"run tests marked {marker}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, (flag, reason) in OPT_IN.items():
            if marker in item.keywords and not config.getoption(flag):
                item.add_marker(pytest.mark.skip(reason=reason))
