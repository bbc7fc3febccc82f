"""``python -m bench`` (or ``bench/run``): every benchmark on this machine, one table.

Each figure is printed beside its baseline measured in the same run, their ratio, the target of issue 33
and PASS / FALLS SHORT; a full run also writes the table into ``docs/performance.md`` with the date, the
machine and the versions of every baseline. ``--json`` prints one object keyed by figure name;
``--quick`` runs each benchmark at a tenth of its size; ``--only NAME[,NAME]`` runs a subset (names:
see ``--list``). Run from the checkout root with the ``bench`` extra installed (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

from bench import report
from bench.common import Figure, machine, versions
from bench.suite import BENCHMARKS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object keyed by figure name")
    ap.add_argument("--quick", action="store_true", help="each benchmark at a tenth of its size")
    ap.add_argument("--only", help="a comma-separated subset of benchmarks (see --list)")
    ap.add_argument("--list", action="store_true", help="the benchmark names, then exit")
    ap.add_argument("--write", action="store_true", help="write docs/performance.md even for --quick or --only")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/performance.md")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    names = list(BENCHMARKS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")

    started = time.monotonic()
    meta: dict[str, Any] = {"date": report.today(), "machine": machine(), "versions": versions(),
                            "args": "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))}
    figures: list[Figure] = []
    timings: dict[str, float] = {}
    ctx: dict[str, Any] = {}
    for name in names:
        t0 = time.monotonic()
        if not args.json:
            print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            figures += BENCHMARKS[name](args.quick, ctx)
        except Exception as exc:  # one benchmark failing does not hide the others: its row says why
            traceback.print_exc(file=sys.stderr)
            first = (str(exc).splitlines() or [""])[0][:300]
            figures.append(Figure(name, "the benchmark failed", None, "", limit=f"{type(exc).__name__}: {first}"))
        timings[name] = round(time.monotonic() - t0, 1)
    meta["seconds"] = time.monotonic() - started
    meta["benchmark_seconds"] = timings

    if args.json:
        print(json.dumps({"figures": {f.name: f.as_json() for f in figures}, **{f.name: f.value for f in figures},
                          "meta": meta}, default=str))
    else:
        print(report.table(figures))
        print(f"\n{len(figures)} figures in {meta['seconds']:.0f} s "
              f"({', '.join(f'{k} {v:g} s' for k, v in timings.items())}); machine: {meta['machine']['cores']} cores, "
              f"load average {meta['machine']['loadavg'][0]} at the start")
    full = not args.quick and not args.only
    if (full or args.write) and not args.no_write:
        report.write_doc(figures, meta)
        if not args.json:
            print(f"written: {report.DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
