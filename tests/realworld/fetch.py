"""Download the real-world corpus's distributions (pip download --no-deps), check their sha256 and
extract the kernels' files into .cache/realworld/src/ (git-ignored).

    python tests/realworld/fetch.py [--mutants]

--mutants also writes each kernel's mutant tree (.cache/realworld/mutants/<kernel>/) and checks that its
find text occurs exactly once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", action="store_true", help="also write and check every mutant tree")
    args = ap.parse_args(argv)
    kernels = corpus.load_manifest()
    try:
        corpus.fetch(kernels)
        for k in kernels if args.mutants else []:
            corpus.mutant_tree(k)
    except RuntimeError as e:
        print(f"fetch: {e}", file=sys.stderr)
        return 2
    print(f"{len(kernels)} kernels from {len({k.dist.key for k in kernels})} distributions in {corpus.CACHE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
