"""The ``streamtopics`` command.

    streamtopics run --config FILE            the daemon (SIGTERM/SIGINT: graceful stop, exit 0)
    streamtopics demo [--docs N] [--topics K] embedded broker + real corpus + daemon, live progress
    streamtopics produce --bootstrap B --topic T (FILE.jsonl | FILE.txt | --corpus 20ng|r8) [--limit N]
    streamtopics inspect SNAPSHOT [--top N]   model facts, top words, prevalence and coherence per topic
    streamtopics export SNAPSHOT --format pyldavis|json|csv [-o FILE]   topics for other tools
    streamtopics check-config [FILE]          validate; print the effective configuration (secrets masked;
                                              no FILE: the packaged defaults)

Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error, 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["main"]

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# The default configuration ships inside the package (config/streamtopics.toml in a checkout
# is a link to it), so an installed command and a checkout run on the same values.
DEFAULT_CONFIG = Path(__file__).resolve().with_name("data") / "streamtopics.toml"


# --------------------------------------------------------------------------- helpers


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _dump_toml(d: dict[str, dict[str, Any]]) -> str:
    lines = []
    for section, values in d.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        lines.append("")
    return "\n".join(lines)


def _load_config_or_exit(path: str):
    from .config import ConfigError, load_config
    from .config import check_daemon_config

    try:
        cfg = load_config(path)
        errs = check_daemon_config(cfg)
        if errs:
            raise ConfigError(errs)
        return cfg, None
    except ConfigError as exc:
        return None, exc.errors


class _Style:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, code: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, t: str) -> str:
        return self(t, "1")

    def dim(self, t: str) -> str:
        return self(t, "2")

    def cyan(self, t: str) -> str:
        return self(t, "36")

    def green(self, t: str) -> str:
        return self(t, "32")

    def yellow(self, t: str) -> str:
        return self(t, "33")


# --------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    cfg, errors = _load_config_or_exit(args.config)
    if errors:
        for line in errors:
            _err(line)
        return EXIT_USAGE
    from .daemon import Daemon
    from .logs import setup_logging

    setup_logging(cfg.logging.level, cfg.logging.format)
    daemon = Daemon(cfg)
    daemon.install_signal_handlers()
    return daemon.run()


# --------------------------------------------------------------------------- check-config


def cmd_check_config(args: argparse.Namespace) -> int:
    from .config import ENV_PREFIX, config_warnings
    from .model_config import resolved

    args.file = args.file or str(DEFAULT_CONFIG)
    cfg, errors = _load_config_or_exit(args.file)
    if errors:
        for line in errors:
            _err(line)
        return EXIT_USAGE
    overrides = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and "__" in k[len(ENV_PREFIX):])
    print(f"# {args.file}: configuration is valid")
    for line in config_warnings(cfg):
        print(f"# warning: {line}")
    if overrides:
        print("# environment overrides: " + ", ".join(overrides))
    print("# effective configuration (secrets shown as ***):\n")
    print(_dump_toml(cfg.to_dict()), end="")
    lines = resolved(cfg.model)
    note = snapshot_note(cfg)
    if lines:
        kept = " (not what the daemon runs: it keeps the snapshot's model, below)" if note else ""
        print(f"\n# left to the library, for this [model]{kept}:\n" + "\n".join(f"#   model.{line}" for line in lines))
    if note:
        print("\n" + "\n".join(f"# {line}" for line in note))
    return EXIT_OK


def snapshot_note(cfg) -> list[str]:
    """What the newest snapshot in ``snapshot.dir`` means for this configuration: the daemon keeps
    its model over [model], so each setting that differs is named (empty: no snapshot, or none)."""
    from .model_config import params_differences
    from .service.checkpoint import SnapshotStore
    from .snapshot import SnapshotError, read_header

    for path in SnapshotStore(cfg.snapshot.dir, keep=1).files():
        try:
            params = read_header(path).get("params") or {}
        except SnapshotError:
            continue
        diff = params_differences(params, cfg.model)
        if not diff:
            return []
        return [f"snapshot.dir holds a model ({path.name}) that the daemon keeps over [model]; it differs in:"] + [
            f"  {k}: snapshot {a!r}, [model] {b!r}" for k, (a, b) in sorted(diff.items())] + [
            "to start another model, point snapshot.dir at a new directory"]
    return []


# --------------------------------------------------------------------------- inspect


def _iso(ts: float | None) -> str:
    if not ts:
        return "unknown"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(ts)))


def cmd_inspect(args: argparse.Namespace) -> int:
    from .model import load_snapshot
    from .snapshot import SnapshotError

    try:
        model = load_snapshot(args.snapshot)
    except (SnapshotError, ValueError, KeyError) as exc:
        _err(f"error: cannot load {args.snapshot}: {exc}")
        return EXIT_USAGE
    info = model.snapshot_info
    st = model.state
    top = max(1, int(args.top))
    topics = [model.top_words(k, top) for k in range(model.n_topics)]
    extra = (info.get("extra") or {}).get("daemon") or {}
    from .export import classifier_json, json_safe, snapshot_quality, topics_json

    tj = topics_json(model, 10)
    quality = snapshot_quality(model)
    prevalence = [t["prevalence"] for t in tj["topics"]]
    npmi = [t["npmi"] for t in tj["topics"]]
    facts = {
        "path": str(Path(args.snapshot).resolve()),
        "created": _iso(info.get("created")),
        "version": int(model.version),
        "docs_seen": int(st.docs_seen),
        "tokens_seen": float(st.tokens_seen),
        "n_topics": int(model.n_topics),
        "vocabulary": len(model.vocab),
        "engine": model.engine,
        "update": model.update,
        "params": model.get_params(),
        "offsets": dict(info.get("offsets") or {}),
        "daemon": {k: v for k, v in extra.items() if k != "quality"},
        "diversity_top25": tj["diversity_top25"],
        "quality": quality,
        "rising": model.trends.rising(5),
        "fading": model.trends.fading(5),
        "alpha": float(st.alpha), "alpha_learned": bool(model.alpha_learned), "beta": float(st.beta),
        "classifier": classifier_json(model),
    }
    if args.json:
        print(json.dumps(json_safe({**facts, "top_words": topics, "prevalence": prevalence, "npmi": npmi}),
                         indent=2, default=str, allow_nan=False))  # NaN (nothing to measure yet) as null
        return EXIT_OK
    p = facts["params"]
    print(f"snapshot    {facts['path']}")
    print(f"created     {facts['created']}")
    print(f"version     {facts['version']} global updates")
    print(f"documents   {facts['docs_seen']:,} seen ({int(facts['tokens_seen']):,} tokens)")
    sparsity = f"sparsity={p['sparsity']}, " if model.engine == "lsparse" else ""
    print(f"model       K={facts['n_topics']} topics, V={facts['vocabulary']:,} words, engine={model.engine}, "
          f"update={model.update}, {sparsity}alpha={facts['alpha']:.4g} "
          f"({'learned' if facts['alpha_learned'] else 'fixed'}), beta={facts['beta']:.4g}")
    offs = facts["offsets"]
    print("offsets     " + (", ".join(f"{k} -> {v}" for k, v in sorted(offs.items())) if offs else "none"))
    if extra:
        print(f"daemon      instance {extra.get('instance', '?')}, group {extra.get('group_id', '?')}, "
              f"{extra.get('batches', '?')} batches in its last run")
    mean = quality.get("mean_npmi")
    print(f"quality     diversity {tj['diversity_top25']:.3f} (unique share of the top-25 words); mean NPMI "
          + (f"{mean:.3f} over the daemon's last {quality.get('window_documents', '?')} documents"
             if mean is not None else "not measured (no daemon quality in this snapshot)"))

    def trend(items):
        return ", ".join(f"{k} ({100 * c:+.2f}%)" for k, c in items) or "none"

    print(f"trends      rising {trend(facts['rising'])}; fading {trend(facts['fading'])}")
    _print_classifier(facts["classifier"], topics)
    print(f"\ntop {top} words per topic (prevalence = smoothed share of recent token mass, NPMI of the top 10):")
    width = len(str(model.n_topics - 1))
    for k, words in enumerate(topics):
        pv = f"{100 * prevalence[k]:5.1f}%" if prevalence[k] is not None else "    - "
        nm = f"{npmi[k]:+.3f}" if npmi[k] is not None else "   -  "
        print(f"  {k:>{width}}  {pv}  {nm}  {' '.join(words)}")
    return EXIT_OK


def _print_classifier(c: dict | None, topics: list[list[str]], max_labels: int = 50) -> None:
    """``inspect``'s classifier lines: what it is, then per label its strongest topics."""
    if c is None:
        return
    def n(count: int, word: str) -> str:
        return f"{count:,} {word}{'' if count == 1 else 's'}"

    task = c["task"] or "no labels yet"
    what = c["loss"] if task == c["loss"] else f"{c['loss']} ({task}), {n(c['n_labels'], 'label')}"
    print(f"classifier  {what}, {n(c['labelled_docs'], 'labelled document')} in {n(c['updates'], 'update')}, "
          f"features \"{c['features']}\"")
    if not c["labels"]:
        return
    print("            strongest topics per label (posterior mean weight; the topic's first words):")
    width = min(32, max(len(str(x["label"])) for x in c["labels"][:max_labels]))
    for x in c["labels"][:max_labels]:
        parts = [f"{k} ({w:+.2f})" for k, w in x["topics"]]
        first = x["topics"][0][0] if x["topics"] else None
        words = f"  {' '.join(topics[first][:4])}" if first is not None else ""
        print(f"    {str(x['label'])[:32]:<{width}}  {', '.join(parts)}{words}")
    if len(c["labels"]) > max_labels:
        print(f"    ... and {len(c['labels']) - max_labels} more (--json lists them all)")


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1)


def _non_negative(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"must be at least {low} (got {v})")
    return v


def cmd_export(args: argparse.Namespace) -> int:
    from .export import json_safe, pyldavis_data, topics_csv, topics_json
    from .model import load_snapshot
    from .snapshot import SnapshotError

    try:
        model = load_snapshot(args.snapshot)
    except (SnapshotError, ValueError, KeyError) as exc:
        _err(f"error: cannot load {args.snapshot}: {exc}")
        return EXIT_USAGE
    try:
        if args.format == "pyldavis":
            text = json.dumps(pyldavis_data(model, max_terms=args.max_terms or None), allow_nan=False)
        elif args.format == "json":
            text = json.dumps(json_safe(topics_json(model, args.top)), indent=2, default=str, allow_nan=False)
        else:
            text = topics_csv(model, args.top)
    except ValueError as exc:  # e.g. a model with no vocabulary yet has nothing for pyLDAvis
        _err(f"error: cannot export {args.snapshot} as {args.format}: {exc}")
        return EXIT_USAGE
    if args.output in (None, "-"):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return EXIT_OK
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        _err(f"error: cannot write {args.output}: {exc.strerror or exc}")
        return EXIT_USAGE
    print(f"wrote {args.output} ({args.format}, {model.n_topics} topics)", file=sys.stderr)
    return EXIT_OK


# --------------------------------------------------------------------------- produce


def _read_documents(args: argparse.Namespace) -> tuple[list[Any], int]:
    """Documents to send (maps) and the number of unusable input lines skipped."""
    limit = args.limit
    if args.corpus:
        from .corpora import load_20newsgroups, load_reuters_r8

        loader = load_20newsgroups if args.corpus == "20ng" else load_reuters_r8
        docs = loader(args.split)[: limit]
        return [{"id": d.id, "text": d.text, "label": d.label} for d in docs], 0
    path = Path(args.file)
    out: list[Any] = []
    skipped = 0
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".ndjson", ".txt"):
        raise ValueError(f"{path}: expected a .jsonl (one JSON document per line) or .txt "
                         "(one document per line) file")
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            if suffix == ".txt":
                out.append({"id": f"{path.stem}:{lineno}", "text": line})
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                _err(f"warning: {path}:{lineno}: not JSON ({exc.msg}); skipped")
                skipped += 1
                continue
            if not isinstance(obj, dict):  # 5, "text", null, [...]: not a document map
                kind = {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}.get(
                    type(obj), "null")
                _err(f"warning: {path}:{lineno}: a JSON {kind}, not a document map "
                     '({"id": ..., "text": ...}); skipped')
                skipped += 1
                continue
            out.append(obj)  # its fields are validated by the daemon: bad documents become dead letters
    return out, skipped


def cmd_produce(args: argparse.Namespace) -> int:
    import msgpack
    from kafka import KafkaProducer

    if bool(args.file) == bool(args.corpus):
        _err("error: give either a FILE or --corpus")
        return EXIT_USAGE
    try:
        docs, skipped = _read_documents(args)
    except (OSError, ValueError) as exc:
        _err(f"error: {exc}")
        return EXIT_USAGE
    if not args.no_create:
        from .testing.broker import create_topics

        try:
            got = create_topics(args.bootstrap, {args.topic: args.partitions})
        except Exception as exc:  # noqa: BLE001
            _err(f"error: cannot create topic {args.topic!r} on {args.bootstrap}: {exc}")
            return EXIT_FAIL
        if got.get(args.topic) not in (None, args.partitions):
            _err(f"note: topic {args.topic!r} already exists with {got[args.topic]} partitions")
    t0 = time.perf_counter()
    try:
        producer = KafkaProducer(bootstrap_servers=args.bootstrap, acks="all", linger_ms=10,
                                 batch_size=262144, compression_type="zstd", enable_idempotence=False,
                                 max_block_ms=15000)
    except Exception as exc:  # noqa: BLE001
        _err(f"error: cannot connect to {args.bootstrap}: {exc}")
        return EXIT_FAIL
    failed = 0
    try:
        futures = [producer.send(args.topic, msgpack.packb(d, use_bin_type=True)) for d in docs]
        producer.flush(timeout=60)
        for f in futures:
            if not f.succeeded():
                failed += 1
    except Exception as exc:  # noqa: BLE001
        _err(f"error: sending failed: {exc}")
        return EXIT_FAIL
    finally:
        producer.close(timeout=5)
    dt = time.perf_counter() - t0
    sent = len(docs) - failed
    print(f"sent {sent:,} documents to {args.topic!r} on {args.bootstrap} in {dt:.2f} s "
          f"({sent / max(dt, 1e-9):,.0f} docs/s)" + (f"; {skipped} lines skipped" if skipped else ""))
    if failed:
        _err(f"error: {failed} documents were not acknowledged")
        return EXIT_FAIL
    return EXIT_OK


# --------------------------------------------------------------------------- demo


def _demo_config(bootstrap: str, args: argparse.Namespace, snapshot_dir: Path):
    from .config import Config

    data: dict[str, Any] = {}
    path = Path(args.config) if args.config else DEFAULT_CONFIG
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    kafka = data.setdefault("kafka", {})
    kafka.update(bootstrap_servers=bootstrap, group_id="streamtopics-demo",
                 # the defaults suit a long-running daemon; a demo wants a fast group join
                 session_timeout_ms=3000, heartbeat_interval_ms=1000, create_topics=True, input_partitions=1)
    model = data.setdefault("model", {})
    if args.topics is not None:
        model["n_topics"] = args.topics
        engine = model.get("engine")
        kind = engine.get("kind", "lsparse") if isinstance(engine, dict) else engine or "lsparse"
        if kind == "lsparse":
            _set_model_field(model, "engine", "sparsity", lambda v: min(int(v), args.topics), 8)
    # Two-letter tokens in 20NG are mostly uuencoded/binary debris ("ax", "ei", "cx").
    _set_model_field(model, "text", "min_word_len", lambda v: max(3, int(v)), 2)
    if not args.unsupervised and model.get("supervision", "none") == "none":
        # The corpus is labelled: learn topics that predict the newsgroup (max-margin), so
        # predictions carry a label and the prequential accuracy is live.  The loss constants
        # are the library's self-scaling defaults (docs/supervised.md §7), nothing tuned here.
        model["supervision"] = "hinge"
    if args.batch is not None:
        data.setdefault("batch", {})["max_docs"] = args.batch
    data.setdefault("snapshot", {})["dir"] = str(snapshot_dir)
    data.setdefault("metrics", {}).update(port=0)
    env = {k: v for k, v in os.environ.items() if k != "STREAMTOPICS_KAFKA__BOOTSTRAP_SERVERS"}
    return Config.from_dict(data, env=env), path


def _set_model_field(model: dict, table: str, key: str, change, default) -> None:
    """``model[table][key] = change(value)`` where the file has it: in its [model.<table>] table,
    or as an earlier flat key (which wins over the table field); else in the table when the file
    has one, else flat. (The demo wrote flat keys only, which overrode the table fields of the
    file it was given: its sparsity and min_word_len were lost.)"""
    sub = model.get(table)
    if isinstance(sub, dict) and key in sub and key not in model:
        sub[key] = change(sub[key])
    elif key in model or not isinstance(sub, dict):
        model[key] = change(model.get(key, default))
    else:
        sub[key] = change(default)


class _DemoProgress:
    """The demo's progress lines: documents done, rate, batches, vocabulary, lag, prequential
    accuracy, and three topics' top words in rotation (from ``daemon.status()``)."""

    def __init__(self, style: _Style, daemon, n: int, key: str, every: float) -> None:
        self.s, self.daemon, self.n, self.key, self.every = style, daemon, n, key, every
        self.t_run = time.perf_counter()
        self.t_first: float | None = None
        self.rotate = 0
        self.last_print = 0.0
        self.shown = ""
        self.prev_done, self.prev_t = 0, None

    def step(self) -> bool:
        """Print when due; True once every document is done."""
        s, st = self.s, self.daemon.status()
        done = st.get("offsets", {}).get(self.key, 0)
        if self.t_first is None and st.get("batches"):
            self.t_first = time.perf_counter()
        now = time.perf_counter()
        if now - self.last_print >= self.every or done >= self.n:
            self.last_print = now
            if not st.get("batches"):
                msg = ("starting: joining the consumer group"
                       + (", compiling the numba kernels (first run only)" if now - self.t_run > 2 else ""))
                if msg != self.shown:
                    print(s.dim(f"{now - self.t_run:6.1f}s  {msg}"), flush=True)
                    self.shown = msg
                self.prev_done, self.prev_t = done, now
                return done >= self.n
            self._line(st, done, now)
        return done >= self.n

    def _line(self, st: dict, done: int, now: float) -> None:
        s = self.s
        lag = sum((st.get("lag") or {}).values())
        rate = (done - self.prev_done) / max(now - self.prev_t, 1e-9) if self.prev_t is not None else 0.0
        self.prev_done, self.prev_t = done, now
        acc = st.get("prequential_accuracy")
        print(f"{s.dim(f'{now - self.t_run:6.1f}s')}  docs {done:>7,}/{self.n:,}  "
              f"{rate:7,.0f} docs/s  batches {st.get('batches', 0):>4}  "
              f"vocab {st.get('vocabulary', 0):>7,}  lag {lag:>6,}"
              + (f"  prequential accuracy {acc:.3f}" if acc is not None else ""), flush=True)
        words = st.get("top_words") or {}
        if words:
            ks = sorted(words)
            for j in range(min(3, len(ks))):
                k = ks[(self.rotate + j) % len(ks)]
                print(f"         {s.cyan(f'topic {k:>3}')}  {' '.join(words[k][:8])}", flush=True)
            self.rotate += 3


def cmd_demo(args: argparse.Namespace) -> int:
    from .config import ConfigError

    s = _Style(not args.no_color and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None)
    t_start = time.perf_counter()
    _sigterm_interrupts()
    out_dir = Path(args.dir)
    snap_dir = out_dir / "snapshots"
    broker = None
    daemon = None
    thread = None
    interrupted = False
    try:
        from .corpora import load_default_corpus
        from .testing.broker import BrokerUnavailable, EmbeddedBroker, create_topics

        print(s.bold("streamtopics demo") + s.dim("  (Ctrl-C stops everything it started)"), flush=True)
        try:  # validate before starting anything
            _demo_config("127.0.0.1:9092", args, snap_dir)
        except ConfigError as exc:
            for line in exc.errors:
                _err(line)
            return EXIT_USAGE
        name, corpus = load_default_corpus("train")
        if args.docs is not None:
            corpus = corpus[: args.docs]
        n = len(corpus)
        print(f"corpus      {name}, train split: {n:,} documents", flush=True)

        try:
            broker = EmbeddedBroker().start()
        except BrokerUnavailable as exc:
            _err(f"error: {exc}")
            return EXIT_FAIL
        print(f"broker      tansu pid {broker.pid} on {broker.bootstrap} (memory storage, stopped on exit)", flush=True)

        # Fresh state every run: an old snapshot's offsets would skip the new topic's data.
        if snap_dir.is_dir():
            for p in snap_dir.glob("*.stsnap"):
                p.unlink()
        snap_dir.mkdir(parents=True, exist_ok=True)
        cfg, cfg_path = _demo_config(broker.bootstrap, args, snap_dir)
        if cfg.model.supervision == "regression":
            print("note        the corpus has labels, not numeric responses: the regression model learns its "
                  "topics, its regressor nothing (a hinge or logistic config learns the labels)", flush=True)
        t = cfg.topics
        create_topics(broker.bootstrap, {t.input: 1, t.output: 1, t.dead_letter: 1})

        t0 = time.perf_counter()
        _demo_produce(broker.bootstrap, t.input, corpus, json_text=cfg.input.format == "json")
        dt = time.perf_counter() - t0
        print(f"produced    {n:,} documents into {t.input!r} in {dt:.1f} s ({n / max(dt, 1e-9):,.0f} docs/s)",
              flush=True)

        from .daemon import Daemon
        from .logs import setup_logging

        log_path = out_dir / "daemon.log"
        setup_logging(cfg.logging.level, cfg.logging.format, path=str(log_path))
        daemon = Daemon(cfg, track_topics=cfg.model.n_topics)
        print(f"daemon      K={cfg.model.n_topics} topics, {cfg.model.engine}/{cfg.model.update}, batches of "
              f"{cfg.batch.max_docs}; config {cfg_path or 'built-in defaults'}; log {log_path}", flush=True)
        thread = threading.Thread(target=daemon.run, name="streamtopics-daemon", daemon=True)
        thread.start()
        daemon.wait_started(timeout=120)
        print(f"metrics     {daemon.metrics_url}/metrics", flush=True)
        if daemon.explorer is not None:
            print(f"explorer    {daemon.metrics_url}/topics  (topics, trends, coherence; JSON at /v1/topics)",
                  flush=True)
        print(flush=True)
        progress = _DemoProgress(s, daemon, n, f"{t.input}:0", args.every)
        while thread.is_alive() and not progress.step():
            time.sleep(0.1)
        t_run, t_first = progress.t_run, progress.t_first
        t_done = time.perf_counter()
        if daemon.explorer is not None and thread.is_alive() and sys.stdin.isatty():
            # a person at a terminal: keep the explorer up to look at (scripts and CI end now)
            print(f"\nstream done; the explorer stays up at {daemon.metrics_url}/topics  "
                  + s.dim("(Ctrl-C to stop)"), flush=True)
            try:
                while thread.is_alive():
                    time.sleep(0.2)
            except KeyboardInterrupt:
                print(flush=True)
        daemon.stop()
        thread.join(timeout=120)
        st = daemon.status()
        _demo_summary(s, daemon, st, name, n, t_first or t_run, t_done, t_start)
        return EXIT_OK if daemon.error is None else EXIT_FAIL
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the daemon and the broker ...", flush=True)
        return EXIT_INTERRUPTED
    finally:
        if daemon is not None:
            daemon.stop()
            if thread is not None:
                try:
                    thread.join(timeout=60)
                except KeyboardInterrupt:
                    pass
        if broker is not None:
            if interrupted:
                broker.stop(grace_s=0.5)  # do not wait out tansu's wait for clients
            broker.cleanup()


def _sigterm_interrupts() -> None:
    """SIGTERM behaves like Ctrl-C (and Ctrl-C works even if the shell started us ignoring it)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)


def _demo_produce(bootstrap: str, topic: str, corpus, json_text: bool = False) -> None:
    """The corpus as one message per document: msgpack, or JSON text when the configuration
    reads only JSON (``input.format = "json"``; "auto" reads both)."""
    import msgpack
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, batch_size=262144,
                             compression_type="zstd", enable_idempotence=False)
    try:
        for d in corpus:
            doc = {"id": d.id, "text": d.text, "label": d.label}
            producer.send(topic, json.dumps(doc).encode() if json_text else msgpack.packb(doc, use_bin_type=True))
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=5)


def _demo_summary(s: _Style, daemon, st: dict, corpus_name: str, n: int, t_first: float, t_done: float,
                  t_start: float) -> None:
    model = daemon.model
    docs = st.get("documents", 0)
    span = max(t_done - t_first, 1e-9)
    print("\n" + s.bold("summary"))
    print(f"  corpus         {corpus_name}: {n:,} documents in")
    print(f"  predictions    {st.get('predictions', 0):,}")
    dead = st.get("dead_letters", 0)
    reasons = ", ".join(f"{k} {v}" for k, v in sorted((st.get("dead_by_reason") or {}).items()))
    print(f"  dead letters   {dead:,}" + (f" ({reasons})" if reasons else ""))
    print(f"  throughput     {docs / span:,.0f} docs/s, {st.get('tokens', 0) / span:,.0f} tokens/s "
          f"({st.get('batches', 0)} batches in {span:.1f} s)")
    print(f"  model          version {model.version}, {int(model.state.docs_seen):,} documents learned, "
          f"vocabulary {len(model.vocab):,}")
    print(f"  wall time      {time.perf_counter() - t_start:.1f} s (corpus, broker, produce, learn, snapshot)")
    curve = st.get("prequential_curve") or []
    if curve:
        print("\n" + s.bold("prequential accuracy") + s.dim("  (label predicted before learning each document; "
                                                         "sliding window of the last labelled documents)"))
        step = max(1, len(curve) // 10)
        points = curve[step - 1::step]
        if points[-1] != curve[-1]:
            points.append(curve[-1])
        for docs_seen, acc in points:
            print(f"  {docs_seen:>8,} docs  {acc:.3f}  {'#' * int(round(acc * 40))}")
    print("\n" + s.bold(f"top words of all {model.n_topics} topics") + s.dim("  (largest first; share of the corpus)"))
    width = len(str(model.n_topics - 1))
    import numpy as np

    mass = model.state.mu[: model.state.n_words].sum(axis=0)  # expected word counts per topic
    share = mass / max(float(mass.sum()), 1e-300)
    for k in np.argsort(-share, kind="stable"):
        print(f"  {s.cyan(f'{k:>{width}}')} {share[k]:5.1%}  {' '.join(model.top_words(int(k), 10))}")
    snap = st.get("last_snapshot")
    print("\n" + s.bold("snapshot") + f"  {snap}")
    if snap:
        print(s.dim(f"  load it: streamtopics inspect {snap}   |   python: streamtopics.load_snapshot(path)"))


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamtopics", description="Topic models learned from a Kafka stream.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="run the daemon", description="Run the daemon until SIGTERM/SIGINT.")
    r.add_argument("--config", required=True, metavar="FILE", help="TOML configuration file")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("demo", help="embedded broker + real corpus + daemon, with live progress",
                       description="Start a local tansu broker, stream the 20 Newsgroups train split (bundled "
                                   "Reuters R8 when 20NG is absent) into it, run the daemon on it, print progress, "
                                   "a summary, the topics and the final snapshot. Everything stops on exit.")
    d.add_argument("--docs", type=_positive, default=None, metavar="N", help="only the first N documents")
    d.add_argument("--topics", type=_positive, default=20, metavar="K",
                   help="number of topics (default 20, one per newsgroup; the config's n_topics otherwise "
                        "is sized for production streams)")
    d.add_argument("--batch", type=_positive, default=None, metavar="N", help="documents per minibatch (config default)")
    d.add_argument("--config", default=None, metavar="FILE", help="base configuration (default: the packaged streamtopics/data/streamtopics.toml)")
    d.add_argument("--dir", default="var/demo", help="where snapshots and the daemon log go (default var/demo)")
    d.add_argument("--every", type=float, default=1.0, metavar="S", help="seconds between progress lines")
    d.add_argument("--no-color", action="store_true", help="plain output")
    d.add_argument("--unsupervised", action="store_true",
                   help="plain LDA (by default the demo learns supervised topics from the newsgroup labels)")
    d.set_defaults(func=cmd_demo)

    pr = sub.add_parser("produce", help="send documents into a topic",
                        description="Send a JSON-lines file (one document map per line), a text file (one "
                                    "document per line) or a bundled corpus into a topic, one msgpack message "
                                    "per document.")
    pr.add_argument("file", nargs="?", help="FILE.jsonl or FILE.txt")
    pr.add_argument("--bootstrap", required=True, help="host:port of a broker")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--corpus", choices=("20ng", "r8"), help="a bundled corpus instead of a file")
    pr.add_argument("--split", choices=("train", "test"), default="train", help="corpus split (default train)")
    pr.add_argument("--limit", type=_positive, default=None, metavar="N", help="at most N documents")
    pr.add_argument("--partitions", type=_positive, default=1, help="partitions when the topic is created (default 1)")
    pr.add_argument("--no-create", action="store_true", help="do not create the topic")
    pr.set_defaults(func=cmd_produce)

    i = sub.add_parser("inspect", help="model facts and top words of a snapshot")
    i.add_argument("snapshot", metavar="SNAPSHOT")
    i.add_argument("--top", type=_positive, default=10, metavar="N", help="words per topic (default 10)")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.set_defaults(func=cmd_inspect)

    e = sub.add_parser("export", help="topics of a snapshot for other tools",
                       description="pyldavis: the arrays pyLDAvis.prepare takes (topic_term_dists, "
                                   "doc_topic_dists, doc_lengths, vocab, term_frequency) as JSON; the document "
                                   "side is pseudo-documents from the prevalence series (README). json: topics, "
                                   "top words, weights, prevalence, coherence. csv: one row per (topic, word).")
    e.add_argument("snapshot", metavar="SNAPSHOT")
    e.add_argument("--format", choices=("pyldavis", "json", "csv"), required=True)
    e.add_argument("-o", "--output", default=None, metavar="FILE", help="output file (default stdout)")
    e.add_argument("--top", type=_positive, default=10, metavar="N", help="json/csv: words per topic (default 10)")
    e.add_argument("--max-terms", type=_non_negative, default=5000, metavar="N",
                   help="pyldavis: keep the N most frequent terms (0 = all; default 5000)")
    e.set_defaults(func=cmd_export)

    c = sub.add_parser("check-config", help="validate a configuration file",
                       description="Validate FILE (plus STREAMTOPICS_* environment overrides) and print the "
                                   "effective configuration with secrets masked. Exit 2 on errors.")
    c.add_argument("file", metavar="FILE", nargs="?", default=None,
                   help="TOML file (default: the packaged defaults, streamtopics/data/streamtopics.toml)")
    c.set_defaults(func=cmd_check_config)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `streamtopics inspect ... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
