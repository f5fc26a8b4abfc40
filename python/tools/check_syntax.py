"""Lint helper: every Python file given parses with the grammar of the oldest supported
Python (3.8), and every module of the package starts with ``from __future__ import
annotations`` (so annotations such as ``X | None`` are never evaluated at run time)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

OLDEST = (3, 8)


def main(paths: list[str]) -> int:
    bad = 0
    for root in paths:
        files = [Path(root)] if root.endswith(".py") else sorted(Path(root).rglob("*.py"))
        for f in files:
            text = f.read_text()
            try:
                tree = ast.parse(text, str(f), feature_version=OLDEST)
            except SyntaxError as e:
                print(f"{f}:{e.lineno}: not valid Python {OLDEST[0]}.{OLDEST[1]}: {e.msg}")
                bad += 1
                continue
            if "src" in f.parts and text.strip():
                first = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
                if not (
                    first
                    and isinstance(first[0], ast.ImportFrom)
                    and first[0].module == "__future__"
                    and any(a.name == "annotations" for a in first[0].names)
                ):
                    print(f"{f}: the first statement must be 'from __future__ import annotations'")
                    bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["."]))
