"""Small array helpers on a ``Batch`` that the model, its fitting loops and its persistence share."""
from __future__ import annotations

import numpy as np

from .batch import Batch, batch_from_arrays
from .parallel import overlapped

TRANSFORM_CHUNK = 2048  # documents per local-step call when inferring many documents at once


def doc_lengths(batch: Batch) -> np.ndarray:
    """Token count N_d of every document of the batch."""
    rows = np.repeat(np.arange(batch.n_docs), np.diff(batch.doc_ptr))
    return np.bincount(rows, weights=batch.counts, minlength=batch.n_docs)


def normalise_rows(doc_topic: np.ndarray) -> np.ndarray:
    """zbar_d = N_dk / N_d (rows of empty documents stay zero)."""
    tot = doc_topic.sum(axis=1, keepdims=True)
    return np.ascontiguousarray(doc_topic / np.where(tot > 0, tot, 1.0))


def slice_batch(batch: Batch, lo: int, hi: int) -> Batch:
    """Documents lo..hi-1 of ``batch`` as a batch of their own (the batch itself when whole)."""
    if lo == 0 and hi == batch.n_docs:
        return batch
    s, e = batch.doc_ptr[lo], batch.doc_ptr[hi]
    return batch_from_arrays(batch.doc_ptr[lo:hi + 1] - s, batch.word_ids[s:e], batch.counts[s:e])


def chunks(n_docs: int):
    """(lo, hi) ranges of at most TRANSFORM_CHUNK documents covering 0..n_docs-1."""
    for lo in range(0, n_docs, TRANSFORM_CHUNK):
        yield lo, min(lo + TRANSFORM_CHUNK, n_docs)


def tokenize_docs(tokenizer, docs, start: int = 0) -> list[list[str]]:
    """Raw strings go through ``tokenizer``; token lists are taken as given (checked to hold str).
    Errors name a document by its index plus ``start`` (its place in a larger call)."""
    if isinstance(docs, (str, bytes)):
        raise TypeError("docs must be a sequence of documents (a list of str or of token lists), not one str")
    out = []
    join = "".join  # raises TypeError unless every item is a str (or a subclass): one C pass
    for i, d in enumerate(docs, start):
        if isinstance(d, str):
            out.append(tokenizer(d))
        elif isinstance(d, (list, tuple)):
            try:
                join(d)
            except TypeError:
                raise TypeError(f"document {i}: a token list must contain only str") from None
            out.append(d if type(d) is list else list(d))  # read only from here on: no copy
        else:
            raise TypeError(f"document {i}: expected str or list[str], got {type(d).__name__}")
    return out


def infer_in_chunks(tokenize, prepare, infer, docs, n_topics: int, overlap: bool) -> np.ndarray:
    """``infer(prepare(tokenize(chunk)))`` over chunks of ``TRANSFORM_CHUNK`` documents, rows
    stacked. With ``overlap`` the next chunk is tokenized and prepared (Python, under the GIL)
    while ``infer`` (GIL-free kernels) runs on this one (``parallel.overlapped``); the chunks are
    the same either way, and so is the result."""
    if isinstance(docs, (str, bytes)):
        tokenize(docs)  # raises the one-str TypeError
    docs = docs if isinstance(docs, (list, tuple)) else list(docs)
    def prep(span):
        return prepare(tokenize(docs[span[0]:span[1]], span[0]))

    parts = overlapped(chunks(len(docs)), prep, infer, overlap)
    return np.concatenate(parts) if parts else np.empty((0, n_topics))

