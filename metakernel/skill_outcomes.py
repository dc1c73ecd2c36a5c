"""What each SKILL.md fed: the attempt that wrote it, its size and lint, and the transfer pair it was given to.

Why a module of its own: `metakernel skills` needs to join the store's skills with the analysis' pairs, which is
neither exporting (`metakernel.export`) nor reporting (`metakernel.analysis.report`). The pairs still come from
`analysis.records.pairs` over `metakernel.export.attempt_table`, so every class, clipped speedup and tier shown
here matches the report's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from metakernel.analysis.records import DIRECTIONS, pairs
from metakernel.export import attempt_table, done_rows, strict_json
from metakernel.store import Store

__all__ = ["skill_outcomes"]


def _tier(passed: Any, speedup: Any) -> int:
    from metakernel.analysis.metrics import tier

    return tier(bool(passed), float(speedup) if bool(passed) else math.nan)


def skill_outcomes(store: Store, model: str | None = None) -> list[dict[str, Any]]:
    """One record per SKILL.md: the attempt that wrote it, the skill's size and lint, and the pair it fed.

    A solo attempt r's skill is given to the skill arm r of the direction it is the source of; that skill attempt
    is compared with the target solo attempt r. The pair's class, clipped speedups and tiers come from
    `analysis.records.pairs` over `attempt_table`, so they match the report. Skills written by other arms fed no
    pair (`fed` is None); a pair whose attempts are not both finished has class "pending".
    """
    from metakernel.plan import model_slug

    table = attempt_table(store)
    pair_table = pairs(table)
    by_pair = {(r.model, r.direction, r.problem, r.replicate): r for r in pair_table.itertuples()}
    rows = {r["attempt_id"]: r for r in store.attempts()}
    done = dict(done_rows(store))
    out = []
    for skill in store.skills():
        aid = skill["attempt_id"]
        row = rows.get(aid)
        if row is None or (model is not None and model not in (row["model"], model_slug(row["model"]))):
            continue
        own = done.get(aid)
        lint = json.loads(skill["lint"])
        record: dict[str, Any] = {
            "attempt_id": aid, "address": aid.rsplit("/", 1)[-1], "model": row["model"], "problem": row["problem"],
            "family": row["family"], "arm": row["arm"], "replicate": row["replicate"], "state": row["state"],
            "source_status": own["status"] if own else None, "source_speedup": own["speedup"] if own else None,
            "source_tier": _tier(own["passed"], own["speedup"]) if own else None,
            "bytes": skill["bytes"], "original_bytes": skill["original_bytes"], "truncated": bool(skill["truncated"]),
            "sha256": skill["sha256"], "lint_findings": len(lint), "lint": lint,
            "direction": None, "fed": None, "compared_with": None, "pair_class": None, "c_skill": None,
            "c_solo": None, "skill_tier": None, "solo_tier": None,
        }
        direction = next((d for d in DIRECTIONS.values() if d.source_arm == row["arm"]), None)
        if direction is not None:
            prefix = aid.rsplit("/", 1)[0]
            fed = f"{prefix}/p{row['problem']:02d}_r{row['replicate']}_{direction.skill_arm}"
            record.update(direction=direction.name, fed=fed,
                          compared_with=f"{prefix}/p{row['problem']:02d}_r{row['replicate']}_{direction.target_arm}")
            pair = by_pair.get((row["model"], direction.name, row["problem"], row["replicate"]))
            if pair is None:
                record["pair_class"] = "pending" if fed in rows else "not planned"
            else:
                record.update(pair_class=pair.pair_class, c_skill=pair.c_skill, c_solo=pair.c_solo,
                              skill_tier=_tier(pair.skill_passed, pair.skill_speedup),
                              solo_tier=_tier(pair.solo_passed, pair.solo_speedup))
        out.append(strict_json(record))
    return out
