#!/usr/bin/env bash
# The test command of the README: installs everything the tests need on a fresh machine, then runs lint,
# type checks and the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== installing rankwatch with test extras"
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'
# An editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE is set (these machines set it) every
# `rankwatch` process, hundreds of them in the tests, compiled the sources again: about 60 ms each
# (docs/benchmarks.md). Compiled once here (pip compiles a non-editable install itself).
python3 -m compileall -q -j 0 rankwatch pipeline consumers exporters

# Debian packages the tests need: promtool/prometheus for rules and live queries, Java and Maven for the
# real Kafka broker (its jars come from Maven Central via deploy/kafka/local.sh fetch).
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if ((${#missing[@]})); then
  echo "== installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ -x deploy/kafka/local.sh ]; then
  echo "== resolving Kafka broker jars (Maven Central)"
  deploy/kafka/local.sh fetch
fi
if [ -x deploy/schema-registry/local.sh ]; then
  echo "== resolving Apicurio Registry (Maven Central)"
  deploy/schema-registry/local.sh fetch
fi

echo "== ruff"
python3 -m ruff check .
echo "== mypy"
python3 -m mypy

echo "== pytest"
set +e
python3 -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
