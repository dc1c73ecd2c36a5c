"""Family cards: `families/<family>.yaml` (name, what the family stresses, member problem numbers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from metakernel.errors import UserError
from metakernel.paths import families_dir
from metakernel.yamlio import load_yaml

#: The six families in numbering order with their sizes (docs/design.md section 2): problems 01-74 run through them.
FAMILY_SIZES: dict[str, int] = {
    "attention": 18,
    "kv_cache": 8,
    "mlp_norm": 17,
    "moe": 8,
    "quantization": 10,
    "linear_attention": 13,
}

_KEYS = {"name", "title", "stresses", "members"}


@dataclass(frozen=True)
class Family:
    """One family card."""

    name: str
    title: str
    stresses: str
    members: tuple[int, ...]
    path: Path


def expected_ranges() -> dict[str, range]:
    """Problem numbers each family must own, derived from `FAMILY_SIZES` in order."""
    ranges, start = {}, 1
    for name, size in FAMILY_SIZES.items():
        ranges[name] = range(start, start + size)
        start += size
    return ranges


def load_family(path: Path) -> Family:
    """Load and validate one card; every problem is a one-line `UserError` naming the file."""
    data = load_yaml(path)
    where = str(path)
    if not isinstance(data, dict):
        raise UserError("expected a mapping with keys name, title, stresses, members", where)
    unknown = set(data) - _KEYS
    missing = _KEYS - set(data)
    if unknown:
        raise UserError(f"unknown key(s): {', '.join(sorted(map(str, unknown)))}", where)
    if missing:
        raise UserError(f"missing key(s): {', '.join(sorted(missing))}", where)
    name = data["name"]
    if name != path.stem:
        raise UserError(f"name {name!r} does not match the file name {path.stem!r}", where)
    for key in ("title", "stresses"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise UserError(f"{key} must be a non-empty string", where)
    members = data["members"]
    if not isinstance(members, list) or not all(isinstance(m, int) and not isinstance(m, bool) for m in members):
        raise UserError("members must be a list of problem numbers (integers)", where)
    if len(set(members)) != len(members):
        raise UserError("members lists a problem number twice", where)
    return Family(name=name, title=data["title"].strip(), stresses=data["stresses"].strip(),
                  members=tuple(members), path=path)


def load_families(directory: Path | None = None) -> dict[str, Family]:
    """All cards in a folder, keyed by name, in `FAMILY_SIZES` order (unknown families after)."""
    directory = directory or families_dir()
    paths = sorted(directory.glob("*.yaml"))
    if not paths:
        raise UserError("no family cards (*.yaml) found", str(directory))
    cards = {p.stem: load_family(p) for p in paths}
    order = [n for n in FAMILY_SIZES if n in cards] + sorted(set(cards) - set(FAMILY_SIZES))
    return {n: cards[n] for n in order}


def check_catalog(families: dict[str, Family], numbers_by_family: dict[str, list[int]]) -> list[str]:
    """Cross-check cards, the expected counts and the problem files; returns human-readable problems found."""
    issues: list[str] = []
    ranges = expected_ranges()
    for name, rng in ranges.items():
        card = families.get(name)
        if card is None:
            issues.append(f"family {name}: no card families/{name}.yaml")
            continue
        if list(card.members) != list(rng):
            expected = f"{rng.start:02d}-{rng.stop - 1:02d}"
            issues.append(f"family {name}: card lists {_span(card.members)}, expected {expected}")
        files = sorted(numbers_by_family.get(name, []))
        if files != list(rng):
            issues.append(f"family {name}: problem files {_span(files)}, expected {rng.start:02d}-{rng.stop - 1:02d}")
    for name in set(families) - set(ranges):
        issues.append(f"family {name}: not one of the six families")
    return issues


def _span(numbers: tuple[int, ...] | list[int]) -> str:
    if not numbers:
        return "none"
    return f"{len(numbers)} problems ({', '.join(f'{n:02d}' for n in numbers)})"
