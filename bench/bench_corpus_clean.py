"""What ``corpora.strip_encoded_blocks`` removes from the real 20 Newsgroups train split.

Reads ../shared/data/20news-bydate.tar.gz (or $STREAMTOPICS_DATA_DIR), applies the loader's
header stripping, then counts, before and after removing the encoded blocks: uuencoded-looking
lines (>= 20 characters), whitespace tokens of >= 20 characters that mix digits and letters,
and the tokenizer's tokens; and lists the posts that changed.

    python bench/bench_corpus_clean.py
"""
from __future__ import annotations

import collections
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamtopics.corpora import (  # noqa: E402
    NEWSGROUPS_ARCHIVE, is_uu_line, find_archive, strip_encoded_blocks, strip_newsgroup_headers)
from streamtopics.text import Tokenizer  # noqa: E402

MIXED = re.compile(r"^(?=\S*\d)(?=\S*[A-Za-z])\S{20,}$")


def main() -> int:
    path = find_archive(NEWSGROUPS_ARCHIVE)
    if path is None:
        print(f"{NEWSGROUPS_ARCHIVE} not found")
        return 1
    tok = Tokenizer()
    st: collections.Counter = collections.Counter()
    changed = []
    with tarfile.open(path, "r:gz") as tar:
        for m in tar:
            if not m.isfile() or not m.name.split("/")[0].endswith("train"):
                continue
            before = strip_newsgroup_headers(tar.extractfile(m).read().decode("latin-1"))
            after = strip_encoded_blocks(before)
            st["posts"] += 1
            for name, t in (("before", before), ("after", after)):
                st[f"uu_lines_{name}"] += sum(1 for ln in t.split("\n") if len(ln) >= 20 and is_uu_line(ln))
                st[f"mixed_tokens_{name}"] += sum(1 for w in t.split() if MIXED.match(w))
                st[f"tokens_{name}"] += len(tok(t))
            if after != before:
                changed.append(m.name)
                st["lines_removed"] += before.count("\n") - after.count("\n")
    print(f"20NG train: {st['posts']:,} posts, {len(changed)} changed, {st['lines_removed']:,} lines removed")
    for what in ("uu_lines", "mixed_tokens", "tokens"):
        b, a = st[f"{what}_before"], st[f"{what}_after"]
        print(f"{what:13s} {b:>10,} -> {a:>10,}  ({100 * (a - b) / max(b, 1):+.1f} %)")
    print("changed posts:", ", ".join(n.split("/", 1)[1] for n in changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
