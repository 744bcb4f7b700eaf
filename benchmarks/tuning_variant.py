"""Write a variant of a tuning table for a whole-step A/B (`benchmarks/decode.py --ab-tuning-file`).

    python benchmarks/tuning_variant.py --op moe.decode --when '{"nvfp4": false}' --set slots_in_down=true \
        --out /tmp/variant.json

    python benchmarks/tuning_variant.py --op gemv.small_m --when '{"m_min": 2, "m_max": 16, "nvfp4": true}' \
        --add '{"m_min": 3, "m_max": 4, "nvfp4": true}' --set block_m=2 use_dot=false --out /tmp/variant.json

Copies the table (default: the H200's shipped one), changes the config fields named by --set (values as JSON) in
every entry of --op whose conditions equal --when (`--when all`: every entry of the op), checks that the result
loads (`flint_kernels.tuning`), and writes it. With --add the matching entries stay as they are: a copy of each,
with the --add conditions and the --set fields, goes in just before it (the first matching entry wins a lookup, so
the copy takes the shapes it names). With --new, an entry of its own (conditions --when, the --set fields) goes
first in the op's list, which is made when the table has none. An entry that does not exist, a field the op's
config lacks or a value of the wrong type is an error.

    python benchmarks/tuning_variant.py --op weights_ahead --new --when '{"nvfp4": true, "tokens_max": 1}' \
        --set next_qkv=true next_o=true --out /tmp/variant.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H200_TABLE = ROOT / "kernels" / "tuning" / "nvidia-h200.json"


def make_variant(
    table: dict, op: str, when: dict | None, changes: dict, add: dict | None = None, new: bool = False
) -> tuple[dict, int]:
    """A copy of `table` with `changes` applied to the config of each `op` entry whose "when" equals `when` (None:
    every entry), or with `add`, to a copy of each (conditions `add`) inserted before it; and how many matched.
    `new`: one entry of its own with conditions `when` and config `changes`, first in the op's list."""
    out = json.loads(json.dumps(table))
    if new:
        entry = {"when": when or {}, "config": changes, "source": "variant: a new entry"}
        out[op] = [entry, *out.get(op, [])]
        return out, 1
    hits = 0
    entries = []
    for entry in out.get(op, []):
        if when is None or entry.get("when", {}) == when:
            hits += 1
            source = f"variant of: {entry.get('source', '')}"
            if add is not None:
                entries.append({"when": add, "config": {**entry["config"], **changes}, "source": source})
            else:
                entry["config"].update(changes)
                entry["source"] = source
        entries.append(entry)
    if op in out:
        out[op] = entries
    return out, hits


def parse_set(items: list[str]) -> dict:
    """["field=json value", ...] -> {field: value}."""
    changes = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {item!r}: expected field=value")
        try:
            changes[name] = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"--set {item!r}: the value is not JSON ({e.msg})") from None
    return changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, default=H200_TABLE, help="the table to start from")
    ap.add_argument("--op", required=True, help='e.g. "moe.decode"')
    ap.add_argument("--when", required=True, help="the entry's conditions as JSON, e.g. '{\"nvfp4\": false}', or all")
    ap.add_argument("--set", nargs="+", required=True, metavar="FIELD=VALUE", help="config fields, values as JSON")
    ap.add_argument("--add", metavar="WHEN", help="insert a changed copy with these conditions (JSON) instead")
    ap.add_argument("--new", action="store_true", help="a new first entry of --op with conditions --when")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from flint_kernels import tuning

    try:
        when = None if args.when == "all" else json.loads(args.when)
        add = None if args.add is None else json.loads(args.add)
        changes = parse_set(args.set)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"tuning_variant: {e}", file=sys.stderr)
        return 2
    variant, hits = make_variant(json.loads(args.table.read_text()), args.op, when, changes, add, args.new)
    if hits == 0:
        which = "entry" if when is None else f"entry with when == {when}"
        print(f"tuning_variant: {args.table} has no {args.op} {which}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(variant, indent=2) + "\n")
    try:
        tuning.load(args.out)
    except tuning.TuningError as e:
        args.out.unlink()
        print(f"tuning_variant: the variant does not load: {e}", file=sys.stderr)
        return 2
    how = "copies of " if add is not None else ""
    print(f"wrote {args.out}: {how}{hits} {args.op} entr{'y' if hits == 1 else 'ies'} with {changes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
