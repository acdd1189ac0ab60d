"""Token corpora for the benchmarks, prepared the way the field usually prepares them.

Every benchmark that compares streamtopics with peers feeds all contenders the SAME token
lists, so the comparison measures the models and not the tokenizers:

* ``twenty_news_tokens(min_df=5)``: 20 Newsgroups bydate, Subject + body, lowercase alphabetic
  tokens of length >= 3, scikit-learn's English stop list, words in >= ``min_df`` training
  documents (V ~ 21k).
* ``twenty_news_long(min_df=5)``: the same documents joined in fours (long documents).
* ``twenty_news_subjects(min_df=2)``: Subject lines only (short texts, ~3 tokens).
* ``twenty_news_package_tokenizer()``: raw text through streamtopics' own ``Tokenizer``.
* ``reuters_r8_tokens(min_df=5)``: Reuters R8, same recipe.

Each returns ``(train, test, train_labels, test_labels)``: lists of token lists and labels.
Test documents with fewer than two tokens are dropped (document completion needs two).
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from streamtopics.corpora import load_20newsgroups, load_reuters_r8
from streamtopics.batch import build_batch
from streamtopics.evaluate import completion_loglik, split_completion
from streamtopics.text import Tokenizer, Vocabulary

_ALPHA3 = re.compile(r"[a-z]{3,}")


def _stop_words() -> frozenset[str]:
    try:
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
        return frozenset(ENGLISH_STOP_WORDS)
    except ImportError:  # bench extra not installed: the package's own list
        from streamtopics.text import ENGLISH_STOPWORDS
        return frozenset(ENGLISH_STOPWORDS)


def common_tokens(text: str, stop: frozenset[str]) -> list[str]:
    return [w for w in _ALPHA3.findall(text.lower()) if w not in stop]


def df_filter(train: list[list[str]], test: list[list[str]], min_df: int) -> tuple[list, list]:
    """Keep words that occur in at least ``min_df`` training documents."""
    df: dict[str, int] = {}
    for d in train:
        for w in set(d):
            df[w] = df.get(w, 0) + 1
    keep = {w for w, c in df.items() if c >= min_df}
    return [[w for w in d if w in keep] for d in train], [[w for w in d if w in keep] for d in test]


def _finish(train, test, ytr, yte):
    tr = [(d, y) for d, y in zip(train, ytr) if d]
    te = [(d, y) for d, y in zip(test, yte) if len(d) >= 2]
    return [d for d, _ in tr], [d for d, _ in te], [y for _, y in tr], [y for _, y in te]


@lru_cache(maxsize=None)
def _news(seed: int):
    return load_20newsgroups("train", seed=seed), load_20newsgroups("test", seed=seed)


def twenty_news_tokens(min_df: int = 5, seed: int = 0):
    tr, te = _news(seed)
    stop = _stop_words()
    a, b = df_filter([common_tokens(d.text, stop) for d in tr], [common_tokens(d.text, stop) for d in te], min_df)
    return _finish(a, b, [d.label for d in tr], [d.label for d in te])


def twenty_news_long(min_df: int = 5, seed: int = 0, group: int = 4):
    train, test, ytr, yte = twenty_news_tokens(min_df, seed)
    join = lambda docs: [sum(docs[i:i + group], []) for i in range(0, len(docs), group)]
    return join(train), join(test), ytr[::group], yte[::group]


def twenty_news_subjects(min_df: int = 2, seed: int = 0):
    tr, te = _news(seed)
    stop = _stop_words()
    subj = lambda d: d.text.split("\n", 1)[0]
    a, b = df_filter([common_tokens(subj(d), stop) for d in tr], [common_tokens(subj(d), stop) for d in te], min_df)
    return _finish(a, b, [d.label for d in tr], [d.label for d in te])


def twenty_news_package_tokenizer(seed: int = 0):
    tr, te = _news(seed)
    tok = Tokenizer()
    return _finish([tok(d.text) for d in tr], [tok(d.text) for d in te], [d.label for d in tr], [d.label for d in te])


def reuters_r8_tokens(min_df: int = 5, seed: int = 0):
    tr, te = load_reuters_r8("train", seed=seed), load_reuters_r8("test", seed=seed)
    stop = _stop_words()
    a, b = df_filter([common_tokens(d.text, stop) for d in tr], [common_tokens(d.text, stop) for d in te], min_df)
    return _finish(a, b, [d.label for d in tr], [d.label for d in te])


def twenty_news_head(n_tokens: int = 50, min_df: int = 5, seed: int = 0):
    """Short documents that are not titles: the first ``n_tokens`` tokens of each 20NG document."""
    train, test, ytr, yte = twenty_news_tokens(min_df, seed)
    return _finish([d[:n_tokens] for d in train], [d[:n_tokens] for d in test], ytr, yte)


def reuters_r8_package_tokenizer(seed: int = 0):
    tr, te = load_reuters_r8("train", seed=seed), load_reuters_r8("test", seed=seed)
    tok = Tokenizer()
    return _finish([tok(d.text) for d in tr], [tok(d.text) for d in te], [d.label for d in tr], [d.label for d in te])


SETTINGS = {
    "20ng-package": twenty_news_package_tokenizer,
    "20ng-df5": twenty_news_tokens,
    "20ng-long": twenty_news_long,
    "20ng-long4-df5": twenty_news_long,  # the name bench_speed.py uses
    "r8-df5": reuters_r8_tokens,
    "20ng-subjects": twenty_news_subjects,
    # Validation settings: preprocessing the defaults were never developed on (no df cut, a heavy
    # df cut, documents cut to their first 50 tokens, R8 through the package's tokenizer).
    "20ng-nodf": lambda seed=0: twenty_news_tokens(min_df=1, seed=seed),
    "20ng-df20": lambda seed=0: twenty_news_tokens(min_df=20, seed=seed),
    "20ng-head50": twenty_news_head,
    "r8-package": reuters_r8_package_tokenizer,
}



def align_topics(model, vocab: Vocabulary) -> np.ndarray:
    """A TopicModel's topic-word matrix with columns in ``vocab``'s order (words the model does
    not know get 1e-12 before renormalising), for scoring it on a peer's shared tokens."""
    tw = model.topic_word()
    cols = model.vocab.ids(vocab.words)
    out = np.full((tw.shape[0], len(vocab)), 1e-12)
    ok = cols >= 0
    out[:, ok] = tw[:, cols[ok]]
    return out / out.sum(axis=1, keepdims=True)

class Setting:
    """A setting's train tokens, one shared vocabulary for the peers, and the fixed completion split;
    every contender is scored by ``score`` (document completion, each model's own alpha)."""

    def __init__(self, name: str, n_train: int | None = None, n_test: int | None = None):
        self.name = name
        train, test, _, _ = SETTINGS[name]()
        self.train = train[:n_train]
        self.test = test[:n_test]
        self.vocab = Vocabulary()
        self.batch = build_batch(self.train, self.vocab)
        test_batch = build_batch(self.test, self.vocab, grow=False)
        self.part_a, self.part_b = split_completion(test_batch, frac=0.8, seed=0)
        self.n_tokens = int(self.batch.counts.sum())
        self.n_docs = len(self.train)

    def score(self, topic_word: np.ndarray, alpha: float) -> float:
        return completion_loglik(topic_word, self.part_a, self.part_b, float(alpha))

    def align(self, model) -> np.ndarray:
        """A TopicModel's topic-word matrix with columns in this setting's vocabulary order."""
        return align_topics(model, self.vocab)

    def bows(self):
        b = self.batch
        return [list(zip(b.word_ids[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist(),
                         b.counts[b.doc_ptr[d]:b.doc_ptr[d + 1]].tolist())) for d in range(b.n_docs)]

    def csr(self):
        import scipy.sparse as sp
        b = self.batch
        return sp.csr_matrix((b.counts, b.word_ids, b.doc_ptr), shape=(b.n_docs, len(self.vocab)))
