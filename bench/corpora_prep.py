"""The common 20 Newsgroups preprocessing for benchmarks against peers.

Subject + body (``streamtopics.corpora`` strips the other mail headers), lowercase
alphabetic tokens of length >= 3 (ASCII letters), scikit-learn's English stop list, and a
document-frequency cut: only words found in >= ``min_df`` TRAINING documents are kept
(the test split is filtered with the training vocabulary).  With ``min_df=5`` the
vocabulary is V = 21,218 words.  Documents are returned as token lists, ready for
``TopicModel.partial_fit`` and for peers fed the same tokens.

    from corpora_prep import twenty_news_tokens
    train, test = twenty_news_tokens(min_df=5)          # lists of token lists
    train4, test4 = long_documents(train, test, group=4)  # 20NG documents joined in fours
"""
from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

_WORD = re.compile(r"[a-z]{3,}")


def stop_words() -> frozenset[str]:
    try:
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
        return frozenset(ENGLISH_STOP_WORDS)
    except ImportError:  # the bench extra is missing: fall back to the library's list
        from streamtopics.text import ENGLISH_STOPWORDS
        return ENGLISH_STOPWORDS


def tokenize(text: str, stop: frozenset[str]) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in stop]


@lru_cache(maxsize=4)
def _prepared(min_df: int, order: str, seed: int):
    from streamtopics.corpora import load_20newsgroups

    stop = stop_words()
    train_docs = load_20newsgroups("train", order=order, seed=seed)
    test_docs = load_20newsgroups("test", order="shuffled", seed=seed)
    train = [tokenize(d.text, stop) for d in train_docs]
    test = [tokenize(d.text, stop) for d in test_docs]
    df = Counter()
    for t in train:
        df.update(set(t))
    keep = frozenset(w for w, c in df.items() if c >= min_df)
    train = tuple(tuple(w for w in t if w in keep) for t in train)
    test = tuple(tuple(w for w in t if w in keep) for t in test)
    labels = tuple(d.label for d in train_docs)
    return train, test, labels, tuple(sorted(keep))


def twenty_news_tokens(min_df: int = 5, order: str = "shuffled", seed: int = 0,
                       drop_empty: bool = True) -> tuple[list[list[str]], list[list[str]]]:
    """(train, test) token lists of 20NG bydate with the df-filtered vocabulary.

    ``drop_empty`` removes documents left without tokens (a handful in each split)."""
    train, test, _, _ = _prepared(int(min_df), order, int(seed))
    train = [list(t) for t in train if t or not drop_empty]
    test = [list(t) for t in test if t or not drop_empty]
    return train, test


def twenty_news_vocabulary(min_df: int = 5) -> list[str]:
    """The kept words, sorted (V = len of it)."""
    return list(_prepared(int(min_df), "shuffled", 0)[3])


def long_documents(train: list[list[str]], test: list[list[str]], group: int = 4
                   ) -> tuple[list[list[str]], list[list[str]]]:
    """Documents joined in groups of ``group`` consecutive ones (the long-document setting)."""
    def join(docs):
        return [[w for d in docs[i:i + group] for w in d] for i in range(0, len(docs), group)]
    return join(train), join(test)


if __name__ == "__main__":
    tr, te = twenty_news_tokens()
    print(f"train {len(tr)} docs {sum(map(len, tr)):,} tokens; test {len(te)} docs {sum(map(len, te)):,} tokens; "
          f"V={len(twenty_news_vocabulary()):,}")
