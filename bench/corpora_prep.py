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
    SETTINGS["20ng-df5"]()   # (train, test, y_train, y_test), also "20ng-long4-df5", "r8-df5"
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


def _filter(train_texts, test_texts, min_df):
    stop = stop_words()
    train = [tokenize(t, stop) for t in train_texts]
    test = [tokenize(t, stop) for t in test_texts]
    df = Counter()
    for t in train:
        df.update(set(t))
    keep = frozenset(w for w, c in df.items() if c >= min_df)
    train = tuple(tuple(w for w in t if w in keep) for t in train)
    test = tuple(tuple(w for w in t if w in keep) for t in test)
    return train, test, keep


@lru_cache(maxsize=4)
def _prepared(min_df: int, order: str, seed: int, corpus: str = "20ng"):
    from streamtopics.corpora import load_20newsgroups, load_reuters_r8

    load = load_20newsgroups if corpus == "20ng" else load_reuters_r8
    train_docs = load("train", order=order, seed=seed)
    test_docs = load("test", order="shuffled", seed=seed)
    train, test, keep = _filter([d.text for d in train_docs], [d.text for d in test_docs], min_df)
    return (train, test, tuple(d.label for d in train_docs), tuple(d.label for d in test_docs),
            tuple(sorted(keep)))


def _drop_empty(docs, labels):
    kept = [(list(t), y) for t, y in zip(docs, labels) if t]
    return [t for t, _ in kept], [y for _, y in kept]


def labelled_tokens(min_df: int = 5, corpus: str = "20ng", order: str = "shuffled", seed: int = 0):
    """(train, test, y_train, y_test): token lists without empty documents, and their labels."""
    train, test, y_train, y_test, _ = _prepared(int(min_df), order, int(seed), corpus)
    train, y_train = _drop_empty(train, y_train)
    test, y_test = _drop_empty(test, y_test)
    return train, test, y_train, y_test


def twenty_news_tokens(min_df: int = 5, order: str = "shuffled", seed: int = 0) -> tuple[list[list[str]], list[list[str]]]:
    """(train, test) token lists of 20NG bydate with the df-filtered vocabulary (documents left
    without tokens, a handful in each split, are dropped)."""
    train, test, _, _ = labelled_tokens(min_df, "20ng", order, seed)
    return train, test


def twenty_news_vocabulary(min_df: int = 5) -> list[str]:
    """The kept words, sorted (V = len of it)."""
    return list(_prepared(int(min_df), "shuffled", 0, "20ng")[4])


def long_documents(train: list[list[str]], test: list[list[str]], group: int = 4
                   ) -> tuple[list[list[str]], list[list[str]]]:
    """Documents joined in groups of ``group`` consecutive ones (the long-document setting)."""
    def join(docs):
        return [[w for d in docs[i:i + group] for w in d] for i in range(0, len(docs), group)]
    return join(train), join(test)


def _long(group: int = 4):
    train, test, y_train, y_test = labelled_tokens(5, "20ng")
    train4, test4 = long_documents(train, test, group)
    return train4, test4, y_train[::group], y_test[::group]  # label: the first document's


# name -> () -> (train, test, y_train, y_test); every setting uses the same preprocessing.
SETTINGS = {
    "20ng-df5": lambda: labelled_tokens(5, "20ng"),
    "20ng-long4-df5": _long,
    "r8-df5": lambda: labelled_tokens(5, "r8"),
}


if __name__ == "__main__":
    for name, make in SETTINGS.items():
        tr, te, _, _ = make()
        V = len({w for d in tr for w in d})
        print(f"{name}: train {len(tr)} docs {sum(map(len, tr)):,} tokens; test {len(te)} docs "
              f"{sum(map(len, te)):,} tokens; V={V:,}")
