"""Typed configuration: one TOML file, environment overrides, validated once at start-up.

Sources, later ones winning:

1. the defaults declared below: the ``[model]`` values come from ``TopicModel``'s own
   signature (one source for the library, the daemon and the demo), and the packaged
   ``streamtopics/data/streamtopics.toml`` (``config/streamtopics.toml`` in a checkout) lists
   the same values, which a test checks;
2. the TOML file given to ``load_config``;
3. environment variables ``STREAMTOPICS_<SECTION>__<KEY>`` (double underscore
   between section and key), e.g. ``STREAMTOPICS_KAFKA__BOOTSTRAP_SERVERS=host:9092``
   or ``STREAMTOPICS_MODEL__N_TOPICS=50``. Values are parsed by the key's type:
   booleans accept true/false/1/0/yes/no/on/off, tables (``extra_consumer``)
   an inline TOML table such as ``{max_poll_records = 100}``.
   Variables with the prefix but without ``__`` are not configuration keys
   and are ignored.

Every key is declared once, with its type, default, allowed values or range
and help text. Validation collects every problem and raises one
``ConfigError`` listing all of them, each line naming the key (and the
environment variable it came from) and what is allowed, e.g.::

    config error: model.engine = "gibbs" is not one of: lsparse, alias
    config error: batch.max_docs must be an integer >= 1 (got 0)
    config error: unknown key model.n_topic (did you mean model.n_topics?)

Relative paths (``snapshot.dir``, SSL files) resolve against the working directory.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import model_config
from .model_config import model_from_config, param_differences
from .options import SUP_FEATURES

if typing.TYPE_CHECKING:
    from streamtopics.model import TopicModel
    from streamtopics.stream.codec import Limits

__all__ = [
    "ENV_PREFIX",
    "BatchConfig",
    "Config",
    "ConfigError",
    "KafkaConfig",
    "LimitsConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ModelConfig",
    "ReplicationConfig",
    "SnapshotConfig",
    "TopicsConfig",
    "load_config",
    "check_daemon_config",
    "compression_kwargs",
    "config_warnings",
    "model_from_config",
    "param_differences",
    "prequential_window",
]

ENV_PREFIX = "STREAMTOPICS_"
MASK = "***"
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


def compression_kwargs(kind: str) -> dict:
    """A producer's compression setting for ``kind`` (one of ``COMPRESSIONS``; none: left out)."""
    return {} if kind == "none" else {"compression_type": kind}


class ConfigError(ValueError):
    """All configuration problems found, one ``config error: ...`` line each."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


# --------------------------------------------------------------------------- field spec


@dataclass(frozen=True)
class Spec:
    """What a key accepts. The type comes from the dataclass annotation."""

    help: str
    choices: tuple[str, ...] | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    nonempty: bool = False
    secret: bool = False


def opt(default: Any, help: str, **spec: Any) -> Any:
    """Declare one configuration key."""
    md = {"spec": Spec(help=help, **spec)}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=md)
    return field(default=default, metadata=md)


def _spec(f: dataclasses.Field) -> Spec:
    return f.metadata["spec"]


# --------------------------------------------------------------------------- sections

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = opt("127.0.0.1:9092", "Comma-separated host:port list of brokers to bootstrap from.", nonempty=True)
    client_id: str = opt("streamtopics", "Client id shown in broker logs and quotas.", nonempty=True)
    group_id: str = opt("streamtopics", "Consumer group; offsets are committed under it.", nonempty=True)
    security_protocol: str = opt("PLAINTEXT", "How to reach the brokers.", choices=_SECURITY_PROTOCOLS)
    sasl_mechanism: str = opt(
        "",
        "SASL mechanism; required with SASL_* protocols, empty otherwise. OAUTHBEARER needs a token "
        "provider object supplied in code; GSSAPI options go in extra_consumer/extra_producer.",
        choices=_SASL_MECHANISMS,
    )
    sasl_plain_username: str = opt("", "User for PLAIN and SCRAM-*.")
    sasl_plain_password: str = opt(
        "", "Password for PLAIN and SCRAM-*; prefer STREAMTOPICS_KAFKA__SASL_PLAIN_PASSWORD to a file.", secret=True
    )
    ssl_cafile: str = opt("", "CA bundle (PEM) to verify brokers; empty = system CAs. SSL and SASL_SSL only.")
    ssl_certfile: str = opt("", "Client certificate (PEM) for mutual TLS. SSL and SASL_SSL only.")
    ssl_keyfile: str = opt("", "Client private key (PEM) for mutual TLS. SSL and SASL_SSL only.")
    ssl_check_hostname: bool = opt(True, "Verify that broker certificates match their host names.")
    session_timeout_ms: int = opt(
        10000, "Group member is expelled after this long without a heartbeat; group joins take about half of it.", ge=1
    )
    heartbeat_interval_ms: int = opt(3000, "Heartbeat period; must be below session_timeout_ms (a third is usual).", ge=1)
    max_poll_interval_ms: int = opt(300000, "Longest allowed gap between polls before the member leaves the group.", ge=1)
    fetch_max_wait_ms: int = opt(
        100, "Longest a fetch waits for data; bounds end-to-end latency on brokers that do not wake fetches.", ge=0
    )
    metadata_max_age_ms: int = opt(
        30000, "Cluster metadata is refreshed at least this often (kafka-python's default is 5 minutes): bounds how "
               "long partitions added to the input topic, or a topic recreated by a broker that lost its data, stay "
               "unread.", ge=1000)
    request_timeout_ms: int = opt(30000, "Client request timeout; must exceed fetch_max_wait_ms and stay below the 9-minute idle-connection limit.", ge=1, le=539999)
    compression_type: str = opt("zstd", "Producer compression.", choices=COMPRESSIONS)
    producer_linger_ms: int = opt(10, "Producer waits this long to fill a batch (throughput vs latency).", ge=0)
    producer_batch_size: int = opt(262144, "Producer batch size in bytes per partition.", ge=1)
    producer_max_in_flight: int = opt(5, "Unacknowledged produce requests per connection.", ge=1)
    enable_idempotence: bool = opt(
        False,
        "Idempotent producer. Off by default: a broker that loses producer state on restart (tansu) "
        "breaks a long-lived idempotent producer; exactness comes from snapshots with offsets instead.",
    )
    create_topics: bool = opt(True, "Create the input, output and dead-letter topics at start-up if missing, and again "
                                    "while running if the broker lost them; the daemon's clients then never auto-create topics.")
    input_partitions: int = opt(1, "Partitions of topics created by streamtopics.", ge=1)
    replication_factor: int = opt(1, "Replication factor of topics created by streamtopics (3 on a real cluster).", ge=1)
    extra_consumer: dict[str, Any] = opt({}, "Extra kafka-python KafkaConsumer settings, passed verbatim (they win).")
    extra_producer: dict[str, Any] = opt({}, "Extra kafka-python KafkaProducer settings, passed verbatim (they win).")

    def _common_kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
            "request_timeout_ms": self.request_timeout_ms,
            "metadata_max_age_ms": self.metadata_max_age_ms,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kw["ssl_check_hostname"] = self.ssl_check_hostname
        # kafka-python treats "" as a value (e.g. an empty CA path), so unset means absent.
        for key in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, key)
            if value != "":
                kw[key] = value
        return kw

    def consumer_kwargs(self) -> dict[str, Any]:
        """``KafkaConsumer(**kwargs)``: manual commits (offsets are saved with the model), earliest reset."""
        kw = self._common_kwargs()
        kw.update(
            group_id=self.group_id,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_poll_interval_ms=self.max_poll_interval_ms,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            enable_auto_commit=False,
            # 'latest' is unreliable on tansu and would silently skip data on a new group.
            auto_offset_reset="earliest",
        )
        kw.update(self.extra_consumer)
        return kw

    def producer_kwargs(self) -> dict[str, Any]:
        """``KafkaProducer(**kwargs)``: acks=all; values are bytes already encoded by the codec."""
        kw = self._common_kwargs()
        kw.update(
            acks="all",
            enable_idempotence=self.enable_idempotence,
            linger_ms=self.producer_linger_ms,
            batch_size=self.producer_batch_size,
            max_in_flight_requests_per_connection=self.producer_max_in_flight,
        )
        kw.update(compression_kwargs(self.compression_type))
        kw.update(self.extra_producer)
        return kw

    def admin_kwargs(self) -> dict[str, Any]:
        """``KafkaAdminClient(**kwargs)`` for topic creation."""
        return self._common_kwargs()


@dataclass(frozen=True)
class TopicsConfig:
    input: str = opt("documents", "Topic the documents are read from.", nonempty=True)
    output: str = opt("predictions", "Topic the per-document predictions are written to.", nonempty=True)
    dead_letter: str = opt("dead-letters", "Topic for messages that could not be processed.", nonempty=True)
    snapshots: str = opt("", "Topic announcing each written snapshot (path and offsets); empty = do not announce.")
    events: str = opt("", "Topic receiving a record when a topic's prevalence or top words change beyond the "
                          "metrics.events_* thresholds; empty = no events.")


def _library_default(name: str, none_as: Any = None) -> Any:
    """The default of ``TopicModel(...)``'s keyword ``name``; None (or "auto") becomes the
    config's sentinel ``none_as`` (0 = "let the library decide", as elsewhere in this file)."""
    import inspect

    from .model import TopicModel
    from .options import FLAT, flat_default

    v = flat_default(name) if name in FLAT else inspect.signature(TopicModel.__init__).parameters[name].default
    return none_as if v is None or v == "auto" else v


@dataclass(frozen=True)
class InputConfig:
    format: str = opt("msgpack", "Encoding of input messages: msgpack, json (UTF-8 JSON objects, same schema) or auto (JSON when a message starts with { or [, else msgpack).", choices=("msgpack", "json", "auto"))


@dataclass(frozen=True)
class ModelConfig:
    engine: str = opt("lsparse", "Local inference: lsparse (sparse variational) or alias (alias-table Metropolis-Hastings).", choices=("lsparse", "alias"))
    n_topics: int = opt(_library_default("n_topics"), "Number of topics K.", ge=2, le=100000)
    sparsity: int = opt(_library_default("sparsity"), "Non-zero topics kept per word type of a document in the sparse local step; n_topics or more is the exact dense step.", ge=1)
    update: str = opt("stochastic", "Global update: stochastic (decaying step) or memoized (exact over a window of batches).", choices=("stochastic", "memoized"))
    alpha: float = opt(_library_default("alpha", 0.0), "Document-topic Dirichlet prior (per topic); 0 = the library's default: learned from the stream (empirical Bayes, docs/defaults.md), or 1 (fixed) for a supervised model of the variational engine (docs/supervised.md §9).", ge=0)
    beta: float = opt(_library_default("beta", 0.0), "Topic-word Dirichlet prior (per topic); 0 = 1/n_topics, one pseudo-count per word over all topics (docs/defaults.md).", ge=0)
    seed: int = opt(0, "Random seed; same seed and input give the same model.", ge=0)
    delay: float = opt(_library_default("delay"), "Stochastic step rho_t = max(rho_min, (delay + t) ** -forgetting_rate), t in batches of 256 documents (a smaller batch is that fraction of a step): tau0.", ge=0)
    forgetting_rate: float = opt(_library_default("forgetting_rate"), "Stochastic step decay kappa; (0.5, 1] guarantees convergence.", gt=0.5, le=1)
    rho_min: float = opt(_library_default("rho_min"), "Floor of the stochastic step so the model keeps adapting to drift; 0 = no floor.", ge=0, lt=1)
    corpus_size: int = opt(_library_default("corpus_size", 0),
                           "Documents D the stochastic update scales a batch to; 0 = derived from the stream: "
                           "max(documents seen, topics x vocabulary / mean document length) (docs/defaults.md).", ge=0)
    births: bool = opt(_library_default("births"), "Stochastic update: replace a topic that holds less than a newborn would by one seeded from the batch's worst-explained documents (docs/topic-quality.md).")
    memo_window: int = opt(_library_default("memo_window"), "Batches the memoized update remembers (older ones are forgotten); 0 = all.", ge=0)
    vocab_cap: int = opt(_library_default("vocab_cap"), "Largest vocabulary size; 0 = unbounded.", ge=0)
    vocab_decay: float = opt(_library_default("vocab_decay"), "Eviction: the word counts that pick the rarest decay by this factor per batch.", gt=0, le=1)
    vocab_policy: str = opt("ignore", "When the vocabulary is full: ignore new words, or evict the rarest.", choices=("ignore", "evict"))
    min_word_len: int = opt(_library_default("min_word_len"), "Shorter tokens are dropped by the tokenizer.", ge=1)
    max_word_len: int = opt(_library_default("max_word_len"), "Longer tokens are dropped by the tokenizer (>= min_word_len).", ge=1)
    stopwords: str = opt("english", "Stopword list removed by the tokenizer.", choices=("english", "none"))
    segmentation: str = opt("whitespace", "Word segmentation: whitespace (words between spaces and punctuation) or cjk_bigrams (also cut runs of Chinese, Japanese, Korean and Thai characters into overlapping character pairs).", choices=("whitespace", "cjk_bigrams"))
    supervision: str = opt("none", "Supervised topics: none, hinge (max-margin), logistic, or regression on 'response'.", choices=("none", "hinge", "logistic", "regression"))
    sup_c: float = opt(0.0, "Supervised loss: regularisation constant c (weight of the labels against the words); 0 = scales itself with the mean labelled document length.", ge=0)
    sup_ell: float = opt(0.0, "Hinge loss margin ell; 0 = 1 (the unit of the discriminant).", ge=0)
    sup_epsilon: float = opt(0.0, "Regression: width of the insensitive zone epsilon; 0 = 1e-3 response standard deviations.", ge=0)
    sup_prior_var: float = opt(0.0, "Prior variance of the classifier weights; 0 = K unit^2 (scales itself).", ge=0)
    sup_decay: float = opt(_library_default("sup_decay", 0.0), "Weight the classifier keeps from earlier labelled batches per batch (1 = exact streaming posterior); 0 = the topics' own 1 - rho_t (1 under the memoized update).", ge=0, le=1)
    sup_sweeps: int = opt(_library_default("sup_sweeps"), "Gibbs sweeps of the classifier per labelled batch.", ge=1)
    sup_burn_in: int = opt(-1, "Classifier sweeps discarded before averaging; -1 = half of sup_sweeps.", ge=-1)
    sup_pg_method: str = opt(_library_default("sup_pg_method", none_as="auto"), "Logistic loss: Polya-Gamma sampler, exact, gamma_sum (approximate, cost free of c) or auto (exact for c <= 8).", choices=("auto", "exact", "gamma_sum", "devroye"))
    sup_max_labels: int = opt(0, "Cap of the label vocabulary (labels past it are errors); 0 = unbounded.", ge=0)
    sup_features: str = opt(_library_default("sup_features", none_as="auto"), "Topic proportions the classifier learns from and predicts with: auto (mean-field for the alias engine, else unsupervised), unsupervised (the engine's label-free local step), mean-field (the variational label-free step at the flat supervised alpha) or supervised (training only).", choices=SUP_FEATURES)
    sup_local: bool = opt(_library_default("sup_local"), "Include the label term in the variational local step of labelled batches.")
    prequential_window: int = opt(1000, "Labelled documents over which the prequential accuracy metric is computed.", ge=1)
    max_local_iters: int = opt(_library_default("max_iter"), "Upper bound on local-step iterations per document.", ge=1)
    local_tol: float = opt(_library_default("tol"), "Local step stops when the mean change of theta falls below this.", gt=0)
    active_eps: float = opt(_library_default("active_eps"), "Local step: topics below this responsibility leave a word's active set.", ge=0)
    restarts: bool = opt(_library_default("restarts"), "Local-step restarts: try other initialisations on hard documents and keep the best.")
    restart_trials: int = opt(_library_default("restart_trials"), "Other starts tried per hard document.", ge=0)
    restart_iters: int = opt(_library_default("restart_iters"), "Iterations of each restart trial.", ge=1)
    init: str = opt(_library_default("init"), "Topic seeding from the first batch(es), one topic per distinct document: kmeans++ (diverse documents) or random.", choices=("kmeans++", "random"))
    init_smoothing: float = opt(_library_default("init_smoothing"), "Pseudo-counts every (word, topic) starts with.", ge=0)
    threads: int = opt(0, "Threads of the variational local step (a batch's documents split over them; the model "
                          "is the same for any number); 0 = the cores the process may use.", ge=0, le=1024)
    burn_in: int = opt(_library_default("burn_in"), "Alias engine: sweeps over each minibatch before its statistics are collected.", ge=0)
    sample_sweeps: int = opt(_library_default("sample_sweeps"), "Alias engine: sweeps whose topic counts are averaged into the update.", ge=1)
    mh_steps: int = opt(_library_default("mh_steps", 0), "Alias engine: Metropolis-Hastings steps of each kind (word, doc) per token and sweep; 0 = auto: 1 from 256 topics on (with 2 word and 3 doc candidates), else 2 (2 also when tries is set).", ge=0)
    proposal: str = opt(_library_default("proposal"), "Alias engine: cycle or mixture of the word and doc proposals.", choices=("cycle", "mixture"))
    table_draws: int = opt(0, "Alias engine: samples drawn per alias table before it is rebuilt; 0 = max(K, 256).", ge=0)
    alpha_proposal: str = opt(_library_default("alpha_proposal"), "Alias engine: the doc proposal's alpha part drawn from the word's table (word) or uniformly.", choices=("word", "uniform"))
    tries: int = opt(0, "Alias engine: candidates per word MH step (multiple-try); 0 = 2 from 256 topics on, else 1.",
                     ge=0, le=64)
    doc_tries: int = opt(0, "Alias engine: candidates per doc MH step (multiple-try); 0 = auto: from 256 topics on 3, or more (up to 16) where K x alpha outweighs a document's other tokens, else 1.", ge=0, le=64)
    kernel: str = opt(_library_default("kernel", "auto"), "Alias engine: kernel of batch fits without labels; auto = dense exact Gibbs up to 768 topics, alias-MH above.", choices=("auto", "dense", "mh"))


@dataclass(frozen=True)
class BatchConfig:
    max_docs: int = opt(256, "A minibatch is learned when it holds this many documents ...", ge=1)
    max_wait_ms: int = opt(1000, "... or when its first document has waited this long.", ge=0)
    max_inflight_predictions: int = opt(10000, "Backpressure: polling pauses while this many predictions await delivery.", ge=1)


@dataclass(frozen=True)
class SnapshotConfig:
    dir: str = opt("var/snapshots", "Directory of snapshot files (written atomically).", nonempty=True)
    every_batches: int = opt(0, "Snapshot every N learned batches; 0 = off (by time: a snapshot is the whole model).", ge=0)
    every_seconds: float = opt(60.0, "Snapshot at least this often; 0 = off.", ge=0)
    keep: int = opt(5, "Snapshots kept on disk; older ones are deleted.", ge=1)


@dataclass(frozen=True)
class MetricsConfig:
    host: str = opt("127.0.0.1", "Address of the Prometheus /metrics and health endpoints.", nonempty=True)
    port: int = opt(9464, "Port of the metrics endpoint; 0 = any free port.", ge=0, le=65535)
    prequential_window: int = opt(1000, "Documents in the sliding window of prequential (test-then-train) metrics.", ge=1)
    explorer: bool = opt(True, "Serve the topic explorer (/topics, /v1/topics) and measure topic quality and trends per batch.")
    quality_window_docs: int = opt(5000, "Documents of the stream (whole batches) over which topic coherence (NPMI) is measured.", ge=1)
    events_prevalence_change: float = opt(0.5, "Relative change of a topic's smoothed prevalence since its last event that fires one.", gt=0)
    events_words_changed: int = opt(3, "Top-10 words replaced since a topic's last event that fire one; 0 = never for words.", ge=0, le=10)


@dataclass(frozen=True)
class LoggingConfig:
    level: str = opt("INFO", "Log level.", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    format: str = opt("json", "json (one object per line, for collectors) or text (for terminals).", choices=("json", "text"))


@dataclass(frozen=True)
class LimitsConfig:
    """Input bounds; mirrors ``streamtopics.stream.codec.Limits``. Calling it builds one."""

    max_message_bytes: int = opt(1_048_576, "Largest accepted message value in bytes (checked before decoding).", ge=1)
    max_text_chars: int = opt(200_000, "Largest 'text' in characters.", ge=1)
    max_tokens: int = opt(50_000, "Most 'tokens' per document.", ge=1)
    max_token_chars: int = opt(100, "Longest token in characters.", ge=1)
    max_docs_per_message: int = opt(10_000, "Most documents in one array message.", ge=1)
    max_labels: int = opt(64, "Most 'labels' per document.", ge=1)
    max_label_chars: int = opt(128, "Longest label in characters.", ge=1)

    def __call__(self) -> Limits:
        # Imported late: config must not pull in the stream package at import time.
        from streamtopics.stream.codec import Limits

        return Limits(**dataclasses.asdict(self))


@dataclass(frozen=True)
class ReplicationConfig:
    enabled: bool = opt(False, "Replicas in one consumer group learn one shared model through an update log "
                               "(docs/scale-out.md); off = one daemon, one model.")
    updates_topic: str = opt("streamtopics-updates", "The update log: one partition, every replica publishes "
                                                     "its learned batches' statistics to it and applies all of it "
                                                     "in order.", nonempty=True)
    replica_id: str = opt("", "Name of this replica in predictions and logs; empty = host name and process id.")
    max_staleness: int = opt(4, "Most update-log records a batch may be computed behind the log's end "
                                "(the replica applies the log first otherwise).", ge=0, le=10000)
    max_record_bytes: int = opt(900000, "Largest update-log message; bigger records are split into parts.",
                                ge=65536)
    compression_type: str = opt("none", "Compression of the update log's records (kafka.compression_type is the "
                                        "predictions'): every replica produces its own and consumes all of them.",
                                choices=COMPRESSIONS)
    snapshots_topic: str = opt("", "Topic replicas ship their snapshots to (in chunks, with manifests in "
                                   "<topic>-manifests), so a replica starting with an empty snapshot directory "
                                   "fetches the newest instead of replaying the whole log; empty = off.")


_SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig,
    "topics": TopicsConfig,
    "input": InputConfig,
    "model": ModelConfig,
    "batch": BatchConfig,
    "snapshot": SnapshotConfig,
    "metrics": MetricsConfig,
    "logging": LoggingConfig,
    "limits": LimitsConfig,
    "replication": ReplicationConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole configuration. ``cfg.limits()`` returns the codec ``Limits``."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    input: InputConfig = field(default_factory=InputConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    replication: ReplicationConfig = field(default_factory=ReplicationConfig)
    # what loading noticed that is not an error (``config_warnings`` says it)
    notes: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict for logs and snapshot headers; secrets shown as ``***``."""
        out: dict[str, dict[str, Any]] = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            d: dict[str, Any] = {}
            for f in dataclasses.fields(section):
                v = getattr(section, f.name)
                if _spec(f).secret:
                    v = MASK if v else ""
                elif isinstance(v, dict):
                    v = {k: (MASK if _secret_name(k) and x not in ("", None) else x) for k, x in v.items()}
                d[f.name] = v
            out[name] = model_config.tables(section) if name == "model" else d
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
        """Validate a mapping shaped like the TOML file (plus optional env overrides)."""
        return _build(data, env or {})


def _secret_name(key: str) -> bool:
    k = key.lower()
    return any(s in k for s in ("password", "secret", "token"))


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None, env: Mapping[str, str] = os.environ) -> Config:
    """Read ``path`` (or only defaults when None), apply env overrides, validate everything."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError([f"config error: cannot read {path}: {e}"]) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"config error: {path} is not valid TOML: {e}{_toml_hint(text, e)}"]) from None
    return _build(data, env)


def _toml_hint(text: str, err: Exception) -> str:
    """What a TOML error most likely means in this file: a table (``[model.supervision]``) opened
    where its short form (``supervision = "none"`` under ``[model]``, as shipped) is still set.
    TOML allows one or the other; its own message names only a line and column."""
    m = re.search(r"line (\d+)", str(err))
    if "overwrite" not in str(err) or m is None:
        return ""
    lines = text.splitlines()
    header = re.match(r"\s*\[\s*([A-Za-z0-9_.\-]+)\s*\]", lines[int(m.group(1)) - 1] if int(m.group(1)) <= len(lines)
                      else "")
    if header is None or "." not in header.group(1):
        return ""
    parent, key = header.group(1).rsplit(".", 1)
    return (f" (a [{header.group(1)}] table while [{parent}] sets {key} = ... already: TOML allows one or the "
            f"other; delete the {key} = ... line and set kind = ... in the table)")


def _build(data: Mapping[str, Any], env: Mapping[str, str]) -> Config:
    errors: list[str] = []
    # section -> key -> (value, env variable name or None)
    values: dict[str, dict[str, tuple[Any, str | None]]] = {s: {} for s in _SECTIONS}

    spelled: dict[str, str] = {}  # [model] keys given in a sub-table: flat key -> "engine.sparsity"
    flat_given: set[str] = set()  # [model] keys given flat (earlier files' spelling), file or environment
    for sname, table in data.items():
        if not isinstance(table, Mapping) and _placed(sname):  # ``n_topics = 50`` above every [section]
            errors.append(f"config error: {sname} = {_fmt(table)} is outside every [section]: keys go under "
                          f"their section's header (did you mean {_placed(sname)}?)")
            continue
        if sname not in _SECTIONS:
            errors.append(f"config error: unknown section [{sname}]{_suggest(sname, _SECTIONS, '[{}]')}")
            continue
        if not isinstance(table, Mapping):
            errors.append(f"config error: [{sname}] must be a table (got {_fmt(table)})")
            continue
        if sname == "model":  # [model.engine] ... tables onto the flat ModelConfig keys
            table, names, errs = model_config.flatten(table)
            errors.extend(errs)
            spelled.update({k: v for k, v in names.items() if k != v})
            flat_given.update(k for k, v in names.items() if k == v)
        known = {f.name for f in dataclasses.fields(_SECTIONS[sname])}
        for key, value in table.items():
            if key not in known:
                errors.append(
                    f"config error: unknown key {sname}.{key}{_suggest(key, known, sname + '.{}')}"
                )
            else:
                values[sname][key] = (value, None)

    for var in sorted(env):
        if var.startswith(ENV_PREFIX) and "__" not in var[len(ENV_PREFIX):] and _single_underscore(var):
            errors.append(f"config error: {var} is not read: a double underscore separates section and key "
                          f"(did you mean {_single_underscore(var)}?)")
            continue
        if not var.startswith(ENV_PREFIX) or "__" not in var[len(ENV_PREFIX):]:
            continue
        sname, _, key = var[len(ENV_PREFIX):].lower().partition("__")
        if sname not in _SECTIONS:
            errors.append(
                f"config error: {var}: unknown section {sname!r}{_suggest(sname, _SECTIONS, ENV_PREFIX + '{}__' + key.upper(), upper=True)}"
            )
            continue
        known = {f.name for f in dataclasses.fields(_SECTIONS[sname])}
        if sname == "model" and "__" in key:  # STREAMTOPICS_MODEL__ENGINE__SPARSITY
            flat, name = model_config.env_key(key)
            if flat is not None:
                key = flat
                spelled[flat] = name
            else:
                key = name
        elif sname == "model":
            flat_given.add(key)
        if key not in known:
            errors.append(
                f"config error: {var}: unknown key {sname}.{key}"
                f"{_suggest(key, known, ENV_PREFIX + sname.upper() + '__{}', upper=True)}"
            )
            continue
        values[sname][key] = (env[var], var)

    sections: dict[str, Any] = {}
    model_errors = 0  # [model] values that did not pass their own check
    for sname, cls in _SECTIONS.items():
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in values[sname]:
                continue
            raw, var = values[sname][f.name]
            name = spelled.get(f.name, f.name) if sname == "model" else f.name
            ok, value, err = _check(f, f"{sname}.{name}", raw, var)
            if ok:
                kwargs[f.name] = value
            else:
                errors.append(err)
                model_errors += sname == "model"
        sections[sname] = cls(**kwargs)  # invalid keys fall back to defaults so cross-checks still run
    cfg = Config(**sections)
    errors.extend(_cross_checks(cfg))
    # Rules of the option objects, and table fields of another kind, once [model]'s own values are valid
    # (a kind that fell back to its default would call the fields of the kind meant foreign), whatever
    # the other sections' errors: check-config lists every problem at once.
    if not model_errors:
        # a kind switched from the environment keeps the file's other fields without complaint
        env_kinds = {k for k in ("engine", "update", "supervision") if values["model"].get(k, (None, None))[1]}
        flat = sorted(flat_given - set(spelled))
        errors.extend(model_config.kind_errors(cfg.model, spelled, skip=env_kinds)
                      + model_config.flat_kind_errors(cfg.model, flat, skip=env_kinds)
                      + model_config.option_errors(cfg.model))
        # ... but says so: the file's fields of the kind it no longer has are ignored
        others = {"engine", "update", "supervision"} - env_kinds
        ignored = (model_config.kind_errors(cfg.model, spelled, skip=others)
                   + model_config.flat_kind_errors(cfg.model, flat, skip=others))
        cfg = dataclasses.replace(cfg, notes=tuple(
            e.removeprefix("config error: ") + "; the kind comes from the environment, so it is ignored"
            for e in ignored))
    if errors:
        raise ConfigError(errors)
    return cfg


def _placed(name: str) -> str:
    """Where a key found above every section belongs: ``model.n_topics under [model]`` (a key of
    that name, else the closest key name of any section), or "" when nothing is close."""
    keys = {f.name: s for s, cls in _SECTIONS.items() for f in dataclasses.fields(cls)}
    match = [name] if name in keys else difflib.get_close_matches(name, list(keys), n=1, cutoff=0.75)
    return f"{keys[match[0]]}.{match[0]} under [{keys[match[0]]}]" if match else ""


def _single_underscore(var: str) -> str:
    """``STREAMTOPICS_MODEL_N_TOPICS`` -> ``STREAMTOPICS_MODEL__N_TOPICS`` when the part after the
    section names one of its keys exactly; "" otherwise (``STREAMTOPICS_DATA_DIR`` and the other
    variables of the tools are not config keys)."""
    rest = var[len(ENV_PREFIX):].lower()
    for sname, cls in _SECTIONS.items():
        if rest.startswith(sname + "_") and rest[len(sname) + 1:] in {f.name for f in dataclasses.fields(cls)}:
            return f"{ENV_PREFIX}{sname.upper()}__{rest[len(sname) + 1:].upper()}"
    return ""


def _suggest(word: str, candidates: Any, template: str, upper: bool = False) -> str:
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    if not match:
        return ""
    m = match[0].upper() if upper else match[0]
    return f" (did you mean {template.format(m)}?)"


def _fmt(v: Any) -> str:
    """A value as it would be written in TOML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    return repr(v)


def _kind(f: dataclasses.Field) -> type:
    t = f.type
    if isinstance(t, str):  # annotations are strings under "from __future__ import annotations"
        t = {"str": str, "int": int, "float": float, "bool": bool}.get(t, dict)
    return typing.get_origin(t) or t


def _range_text(s: Spec, integer: bool) -> str:
    lo, lo_closed = (s.ge, True) if s.ge is not None else (s.gt, False)
    hi, hi_closed = (s.le, True) if s.le is not None else (s.lt, False)

    def num(x: float) -> str:
        return str(int(x)) if integer or float(x).is_integer() else str(x)

    if lo is not None and hi is not None:
        if integer and lo_closed and hi_closed:
            return f" in {num(lo)}..{num(hi)}"
        return f" in {'[' if lo_closed else '('}{num(lo)}, {num(hi)}{']' if hi_closed else ')'}"
    if lo is not None:
        return f" {'>=' if lo_closed else '>'} {num(lo)}"
    if hi is not None:
        return f" {'<=' if hi_closed else '<'} {num(hi)}"
    return ""


def _in_range(s: Spec, x: float) -> bool:
    return not (
        (s.ge is not None and x < s.ge)
        or (s.gt is not None and x <= s.gt)
        or (s.le is not None and x > s.le)
        or (s.lt is not None and x >= s.lt)
    )


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _check(f: dataclasses.Field, name: str, raw: Any, var: str | None) -> tuple[bool, Any, str]:
    """Parse (env strings) and validate one value: (ok, value, error line)."""
    s = _spec(f)
    kind = _kind(f)
    where = f"{name} (from {var})" if var else name
    shown = "***" if s.secret else _fmt(raw)

    def fail(what: str) -> tuple[bool, Any, str]:
        return False, None, f"config error: {where} must be {what} (got {shown})"

    if kind is bool:
        if var is not None and isinstance(raw, str):
            low = raw.strip().lower()
            if low in _TRUE or low in _FALSE:
                return True, low in _TRUE, ""
            return fail("a boolean: one of true, false, 1, 0, yes, no")
        if isinstance(raw, bool):
            return True, raw, ""
        return fail("true or false")

    if kind is int or kind is float:
        value = raw
        if var is not None and isinstance(raw, str):
            try:
                value = int(raw.strip()) if kind is int else float(raw.strip())
            except ValueError:
                value = None
        integer = kind is int
        ok_type = (
            isinstance(value, int) if integer else isinstance(value, (int, float))
        ) and not isinstance(value, bool)
        if ok_type and not integer:
            value = float(value)
            ok_type = math.isfinite(value)  # TOML allows nan and inf
        if not ok_type or not _in_range(s, value):
            return fail(f"{'an integer' if integer else 'a number'}{_range_text(s, integer)}")
        return True, value, ""

    if kind is dict:
        value = raw
        if var is not None and isinstance(raw, str):
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                value = None
        if not isinstance(value, dict):
            return fail("a table, e.g. {max_poll_records = 100}" if var else "a table")
        return True, dict(value), ""

    # str
    if not isinstance(raw, str):
        return fail("a string")
    if s.choices is not None and raw not in s.choices:
        allowed = ", ".join(c if c else '"" (empty)' for c in s.choices)
        return False, None, f"config error: {where} = {shown} is not one of: {allowed}"
    if s.nonempty and not raw.strip():
        return fail("a non-empty string")
    return True, raw, ""


# --------------------------------------------------------------------------- cross-field rules

_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _cross_checks(cfg: Config) -> list[str]:
    errs: list[str] = []
    k = cfg.kafka
    E = "config error: "

    if k.heartbeat_interval_ms >= k.session_timeout_ms:
        errs.append(
            f"{E}kafka.heartbeat_interval_ms ({k.heartbeat_interval_ms}) must be less than "
            f"kafka.session_timeout_ms ({k.session_timeout_ms})"
        )
    if k.fetch_max_wait_ms >= k.request_timeout_ms:
        errs.append(
            f"{E}kafka.fetch_max_wait_ms ({k.fetch_max_wait_ms}) must be less than "
            f"kafka.request_timeout_ms ({k.request_timeout_ms})"
        )

    sasl = k.security_protocol.startswith("SASL_")
    tls = k.security_protocol in ("SSL", "SASL_SSL")
    if sasl and not k.sasl_mechanism:
        errs.append(
            f"{E}kafka.sasl_mechanism must be set when kafka.security_protocol = {_fmt(k.security_protocol)} "
            f"(one of: {', '.join(m for m in _SASL_MECHANISMS if m)})"
        )
    if not sasl:
        for key in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password"):
            if getattr(k, key):
                errs.append(
                    f"{E}kafka.{key} is set but kafka.security_protocol = {_fmt(k.security_protocol)} does not use SASL "
                    "(use SASL_PLAINTEXT or SASL_SSL)"
                )
    if sasl and k.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        if not k.sasl_plain_username:
            errs.append(f"{E}kafka.sasl_plain_username must be set for kafka.sasl_mechanism = {_fmt(k.sasl_mechanism)}")
        if not k.sasl_plain_password:
            errs.append(
                f"{E}kafka.sasl_plain_password must be set for kafka.sasl_mechanism = {_fmt(k.sasl_mechanism)} "
                f"(e.g. via {ENV_PREFIX}KAFKA__SASL_PLAIN_PASSWORD)"
            )
    if not tls:
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(k, key):
                errs.append(
                    f"{E}kafka.{key} is set but kafka.security_protocol = {_fmt(k.security_protocol)} does not use TLS "
                    "(use SSL or SASL_SSL)"
                )
    if k.enable_idempotence and k.producer_max_in_flight > 5:
        errs.append(f"{E}kafka.producer_max_in_flight must be <= 5 with kafka.enable_idempotence = true (got {k.producer_max_in_flight})")
    errs.extend(_check_extra_kafka_keys(k))
    errs.extend(_check_bootstrap(k.bootstrap_servers))

    t = cfg.topics
    names = {"topics.input": t.input, "topics.output": t.output, "topics.dead_letter": t.dead_letter,
             "topics.snapshots": t.snapshots, "topics.events": t.events}
    if cfg.replication.enabled:  # the update log read as documents, or records in the predictions (replicas audit)
        names |= {"replication.updates_topic": cfg.replication.updates_topic,
                  "replication.snapshots_topic": cfg.replication.snapshots_topic}
    for key, name in names.items():
        if name and (not _TOPIC_RE.match(name) or name in (".", "..")):
            errs.append(
                f"{E}{key} = {_fmt(name)} is not a valid Kafka topic name "
                "(1-249 characters from A-Z a-z 0-9 . _ -)"
            )
    seen: dict[str, str] = {}
    for key, name in names.items():
        if not name:
            continue
        if name in seen:
            # e.g. predictions written to the input topic would be read back as documents
            errs.append(f"{E}{key} and {seen[name]} must differ (both {_fmt(name)})")
        else:
            seen[name] = key

    b = cfg.batch
    if b.max_inflight_predictions < b.max_docs:
        # a full batch could never be published: the poll loop would wait forever
        errs.append(
            f"{E}batch.max_inflight_predictions ({b.max_inflight_predictions}) must be >= batch.max_docs ({b.max_docs})"
        )
    return errs


_SERIALIZED = "the daemon's codec reads and writes the messages' bytes itself"
# Client settings the daemon's guarantees rest on: passed "verbatim, they win", they broke them silently.
_DAEMON_OWNED = {
    "extra_consumer": {
        "enable_auto_commit": "offsets are committed only once a snapshot holds what they cover (exactly once)",
        "auto_offset_reset": "a partition without committed offsets is read from its start, or its records are "
                             "never learned",
        "group_id": "use kafka.group_id", "bootstrap_servers": "use kafka.bootstrap_servers",
        "key_deserializer": _SERIALIZED, "value_deserializer": _SERIALIZED,
    },
    "extra_producer": {
        "acks": "predictions count as published only once every in-sync replica has them (acks = all)",
        "bootstrap_servers": "use kafka.bootstrap_servers",
        "key_serializer": _SERIALIZED, "value_serializer": _SERIALIZED,
    },
}


def _check_bootstrap(servers: str) -> list[str]:
    """``host[:port]`` entries, comma-separated; a typo otherwise surfaced as endless reconnects."""
    errs = []
    for entry in servers.split(","):
        e = entry.strip()
        host, sep, port = e.rpartition(":")
        bare_ipv6 = sep and ":" in host and not host.endswith("]")
        if not e or any(c.isspace() for c in e) or (sep and not host):
            errs.append(f"config error: kafka.bootstrap_servers entry {_fmt(e)} is not host:port")
        elif sep and not bare_ipv6 and not (port.isdigit() and 0 < int(port) < 65536):
            errs.append(f"config error: kafka.bootstrap_servers entry {_fmt(e)} has no valid port (1-65535)")
    return errs


def _check_extra_kafka_keys(k: KafkaConfig) -> list[str]:
    """Typos in extra_* would otherwise surface only when the client is built."""
    try:
        from kafka import KafkaConsumer, KafkaProducer
    except Exception:  # kafka-python absent (library-only use): nothing to check against
        return []
    errs = []
    for table, client in (("extra_consumer", KafkaConsumer), ("extra_producer", KafkaProducer)):
        known = client.DEFAULT_CONFIG
        for key in getattr(k, table):
            if key in _DAEMON_OWNED[table]:
                errs.append(f"config error: kafka.{table}.{key} cannot be set: {_DAEMON_OWNED[table][key]}")
            elif key not in known:
                errs.append(
                    f"config error: kafka.{table}.{key} is not a kafka-python {client.__name__} setting"
                    f"{_suggest(key, known, 'kafka.' + table + '.{}')}"
                )
    return errs


# --------------------------------------------------------------------------- config -> model


def check_daemon_config(cfg: Config) -> list[str]:
    """Settings the configuration schema accepts but this daemon cannot run yet."""
    from .model import ENGINES

    errs = []
    if cfg.model.engine not in ENGINES:
        errs.append(f'config error: model.engine = "{cfg.model.engine}" is not available in this version '
                    f"(allowed: {', '.join(ENGINES)})")
    if cfg.replication.enabled and cfg.model.vocab_policy == "evict":
        errs.append('config error: replication.enabled = true needs [model.vocabulary] policy = "ignore" (an evicted '
                    "word's id is reused, so ids in the update log would name other words)")
    return errs


def config_warnings(cfg: Config) -> list[str]:
    """Settings that are valid but that an operator most likely did not mean (check-config prints
    them, the daemon logs them at start)."""
    out = list(cfg.notes)
    snap = cfg.snapshot
    if snap.every_batches == 0 and snap.every_seconds == 0:
        out.append("snapshot.every_batches = 0 and snapshot.every_seconds = 0: snapshots are written only after "
                   "the first learned batch and at a graceful stop, so after a crash the daemon re-reads and "
                   "re-learns everything since its start (exactly once, but all of it); set one of them")
    from .parallel import available_cores

    threads, cores = cfg.model.threads, available_cores()
    if threads and threads > cores:
        out.append(f"model.threads = {threads} is more than the {cores} cores this process may use: the extra threads "
                   f"only take turns on them (slower, not faster); 0 uses the available cores")
    return out


def prequential_window(cfg: Config) -> int:
    """Documents the prequential accuracy averages over: ``metrics.prequential_window``;
    the older ``model.prequential_window`` still counts where only it was changed."""
    default = type(cfg.metrics)().prequential_window
    if cfg.metrics.prequential_window == default and cfg.model.prequential_window != default:
        return cfg.model.prequential_window
    return cfg.metrics.prequential_window
