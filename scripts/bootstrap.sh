#!/usr/bin/env bash
# Install everything the project needs into .venv and the git-ignored .cache/:
# the Python package with its extras, and the Kafka broker's and Spark's Kafka source jars.
# Idempotent: a second run with unchanged pyproject.toml only checks the jar cache.
set -euo pipefail
cd "$(dirname "$0")/.."

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "error: '$1' not found: install $2" >&2; exit 1; }
}
PYTHON="${PYTHON:-python3}"
need "$PYTHON" "Python 3.11+"
"$PYTHON" - <<'PY' || { echo "error: Python 3.11+ is required" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY

EXTRAS="${BRIDGE_EXTRAS:-test,dev,spark,db,docs,console}"
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${EXTRAS//,/-}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# Jars, fetched with Maven and run on Java, only where something runs them: the broker's unless
# KAFKA_BOOTSTRAP_SERVERS names a Kafka to use (the test extra always wants them: the suite
# starts brokers of its own); Spark's Kafka source when the spark extra is installed.
sets=""
case ",$EXTRAS," in
  *,test,*) sets="kafka" ;;
  *) [ -n "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || sets="kafka" ;;
esac
case ",$EXTRAS," in *,spark,*) sets="$sets spark delta" ;; esac
if [ -n "$sets" ]; then
  need java "a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"
  need mvn "Apache Maven 3.6+ (Debian: apt-get install maven)"
  # shellcheck disable=SC2086 # one argument per jar set
  .venv/bin/bridge fetch $sets
fi
