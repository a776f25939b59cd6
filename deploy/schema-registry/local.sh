#!/usr/bin/env bash
# A real Apicurio Registry 3 on 127.0.0.1 with its Confluent-compatible API, for development, tests and CI.
# Nothing is mocked: the application is Apicurio's own release, resolved from Maven Central by pom.xml
# (io.apicurio:apicurio-registry-app:<version>:tar.gz:all, a Quarkus "fast-jar" started with quarkus-run.jar).
#
#   deploy/schema-registry/local.sh fetch    resolve and unpack the registry into deploy/schema-registry/lib/
#                                            (idempotent, fast when done)
#   deploy/schema-registry/local.sh start    start it, wait until GET /apis/ccompat/v7/subjects answers 200
#   deploy/schema-registry/local.sh stop     stop it (SIGTERM, a clean shutdown; SIGKILL after 30 s)
#   deploy/schema-registry/local.sh status   "running" (exit 0) or "stopped" (exit 3)
#   deploy/schema-registry/local.sh clean    stop it and delete its run directory
#
# Environment: SCHEMA_REGISTRY_PORT (HTTP port, default 8081), SCHEMA_REGISTRY_MANAGEMENT_PORT (Quarkus'
# management interface: health and metrics, default SCHEMA_REGISTRY_PORT + 1 instead of Quarkus' fixed 9000, so
# two registries on different ports never clash), SCHEMA_REGISTRY_HEAP (default 384m),
# SCHEMA_REGISTRY_START_TIMEOUT (seconds, default 120), SCHEMA_REGISTRY_JAVA_OPTS (extra JVM/Quarkus options,
# e.g. "-Dapicurio.ccompat.legacy-id-mode.enabled=true"), SCHEMA_REGISTRY_JAVA_CANDIDATES (space-separated java
# executables to choose from instead of the scan below; a test hook).
# Java: Apicurio 3 is built for Java 21 (class files v65). The JVM is chosen at run time: JAVA_HOME/bin/java when
# it is 21 or newer, else the newest java >= 21 among /usr/lib/jvm/*/bin/java and `java` on PATH.
# Storage: Apicurio 3's default, SQL on an in-memory H2 database (apicurio.storage.kind=sql,
# apicurio.storage.sql.kind=h2, jdbc:h2:mem:...): every start is an empty registry; nothing is kept on disk.
# State lives in deploy/schema-registry/run/<SCHEMA_REGISTRY_PORT>/ (registry.log, registry.pid).
# Observed on a 2-core machine (3.3.3, Temurin 25, -Xmx384m): ready ~7 s after start when idle, 20-37 s under a
# load average of ~17 (hence the 120 s default); RSS ~250-280 MB idle.
#
# What the Confluent-compatible API (/apis/ccompat/v7) hands out, for Confluent framing (magic 0 + 4-byte id),
# found against 3.3.3 (and confluent-kafka 2.16's Python client). tests/deploy/test_schema_registry_local.py
# pins the contentId ids, the canonical-hash quirk, Avro's absent schemaType, Protobuf references, the client
# and the Avro serdes; legacy-id mode, well-known imports, the 422 and the unencoded '/' were checked by hand.
# - The "id" of POST /subjects/<s>/versions and GET /schemas/ids/<id> is Apicurio's *contentId* (default,
#   apicurio.ccompat.legacy-id-mode.enabled=false): byte-identical schema text under two subjects gets the same
#   id, as in Confluent. With legacy-id-mode=true the id is the *globalId* instead (one per artifact version, so
#   the same schema under two subjects gets two ids); producers and consumers must agree on the mode, so leave
#   it off (in legacy mode an unknown id is also a 404 with error_code 40401 "Subject 'gid-N' not found"
#   instead of 40403). Ids are positive and increasing but not dense (a failed registration can use one up).
# - apicurio.ccompat.use-canonical-hash=false (default): content ids come from the exact text, so a
#   re-formatted Avro schema (other whitespace) under a *new* subject gets a new id, where Confluent parses and
#   would reuse the id. Within one subject Apicurio does match semantically: re-registering a re-formatted
#   schema returns the existing version and id. ?normalize=true does not change this. Producers that always
#   send the same text (confluent-kafka's serializers do) are unaffected.
# - GET /schemas/ids/<id> returns {"schema": ...} plus "schemaType" for PROTOBUF/JSON; for AVRO the field is
#   absent (as Confluent does), so a missing schemaType means AVRO.
# - Protobuf: plain schemas and references ({"name","subject","version"}, the imported file registered under its
#   own subject) work; /schemas/ids/<id> returns the references. Imports of google/protobuf/*.proto well-known
#   types register without references. An unresolved reference is 422 (error_code 42201), after a few seconds.
# - Subjects with '/' (Protobuf reference subjects such as "rw/doc.proto") must be percent-encoded in the
#   path (confluent-kafka does); unencoded they are a 404 with an empty body.
# - confluent-kafka's SchemaRegistryClient works with url=http://HOST:PORT/apis/ccompat/v7: register_schema,
#   get_schema, lookup_schema, get_latest_version, get_subjects; AvroSerializer/AvroDeserializer round-trip.
#   Its schema_registry module needs the "schemaregistry" extra (authlib, httpx, cachetools, attrs) and the
#   Avro serdes fastavro: `pip install 'confluent-kafka[avro]'`; plain `confluent-kafka` cannot import it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$HERE/lib"
M2="$HERE/.m2"
PORT="${SCHEMA_REGISTRY_PORT:-8081}"
MANAGEMENT_PORT="${SCHEMA_REGISTRY_MANAGEMENT_PORT:-$((PORT + 1))}"
RUN="$HERE/run/$PORT"
PIDFILE="$RUN/registry.pid"
LOG="$RUN/registry.log"
HEAP="${SCHEMA_REGISTRY_HEAP:-384m}"
START_TIMEOUT="${SCHEMA_REGISTRY_START_TIMEOUT:-120}"
STOP_TIMEOUT=30
MIN_JAVA=21
READY_PATH="/apis/ccompat/v7/subjects"

# shellcheck source=../lib.sh
. "$HERE/../lib.sh"  # die, maven_copy, fetch_marker, pid_from_file, stop_pid

fetch() {
  local marker
  marker="$(fetch_marker "$LIB" "$HERE/pom.xml")"
  if [ -f "$marker" ]; then
    echo "schema registry: present ($(cat "$marker") in deploy/schema-registry/lib)"
    return 0
  fi
  command -v tar >/dev/null 2>&1 || die "tar not found"
  local download="$HERE/.download"
  rm -rf "$LIB" "$download"
  mkdir -p "$LIB" "$download"
  maven_copy "$HERE/pom.xml" "$M2" "$download" "Apicurio Registry"
  local archive
  archive="$(ls "$download"/apicurio-registry-app-*-all.tar.gz 2>/dev/null | head -n 1)"
  [ -n "$archive" ] || die "Maven resolved no apicurio-registry-app-*-all.tar.gz into $download"
  tar -xzf "$archive" -C "$LIB" || die "unpacking $archive failed"
  [ -f "$LIB/quarkus-run.jar" ] || die "no quarkus-run.jar in $archive: not the Quarkus layout this script runs"
  local name
  name="$(basename "$archive" -all.tar.gz)"
  rm -rf "$download"  # the archive stays in deploy/schema-registry/.m2
  echo "$name" >"$marker"
  echo "schema registry: unpacked $name into deploy/schema-registry/lib"
}

java_major() {
  # The feature release of a java executable from `java -version` ("17.0.15", "21", "25.0.3", "1.8.0_412").
  local line version
  line="$("$1" -version 2>&1 | grep -m1 -E 'version "[^"]+"')" || return 1
  version="${line#*version \"}"
  version="${version%%\"*}"
  case "$version" in
    1.*) version="${version#1.}" ;;
  esac
  version="${version%%[!0-9]*}"
  [ -n "$version" ] || return 1
  echo "$version"
}

find_java() {
  # Prints the java to run: JAVA_HOME's when >= 21, else the newest >= 21 among the candidates. Never a fixed
  # path: the machine's JDKs change (a Temurin is upgraded, CI has another layout).
  local candidates=() seen="" best="" best_major=0 found="" java major
  if [ -n "${SCHEMA_REGISTRY_JAVA_CANDIDATES:-}" ]; then
    # shellcheck disable=SC2206
    candidates=($SCHEMA_REGISTRY_JAVA_CANDIDATES)
  else
    if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then
      major="$(java_major "$JAVA_HOME/bin/java" || true)"
      if [ -n "$major" ] && [ "$major" -ge "$MIN_JAVA" ]; then
        echo "$JAVA_HOME/bin/java"
        return 0
      fi
      candidates+=("$JAVA_HOME/bin/java")
    fi
    local j
    for j in /usr/lib/jvm/*/bin/java; do
      [ -x "$j" ] && candidates+=("$j")
    done
    j="$(command -v java 2>/dev/null || true)"
    [ -n "$j" ] && candidates+=("$j")
  fi
  for java in "${candidates[@]}"; do
    [ -x "$java" ] || continue
    case " $seen " in *" $java "*) continue ;; esac
    seen="$seen $java"
    major="$(java_major "$java" || true)"
    [ -n "$major" ] || continue
    found="$found${found:+, }$java ($major)"
    if [ "$major" -ge "$MIN_JAVA" ] && [ "$major" -gt "$best_major" ]; then
      best="$java"
      best_major="$major"
    fi
  done
  if [ -z "$best" ]; then
    echo "Apicurio Registry 3 needs Java $MIN_JAVA or newer, found ${found:-no java}:" \
      "install one (e.g. Debian 'openjdk-21-jre-headless' or a Temurin 21+) or point JAVA_HOME at it"
    return 1
  fi
  echo "$best"
}

running_pid() {
  # Prints the registry's pid when the pid file names a live registry JVM started from this lib/.
  pid_from_file "$PIDFILE" "$LIB/quarkus-run.jar"
}

ready() {
  # True once GET /apis/ccompat/v7/subjects answers 200: storage is initialised and the ccompat API serves.
  # A plain HTTP/1.0 request over bash's /dev/tcp (no curl, no Python), bounded by timeout.
  local status
  status="$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%s\r\nAccept: application/json\r\n\r\n" "$2" "$1" >&3
    head -n 1 <&3' _ "$PORT" "$READY_PATH" 2>/dev/null)" || return 1
  case "$status" in
    "HTTP/1."?" 200"*) return 0 ;;
  esac
  return 1
}

start() {
  local java pid
  # Java first: without a usable JVM nothing else matters, and the message is one clear line.
  java="$(find_java)" || die "$java"
  if pid="$(running_pid)"; then
    if ready; then
      echo "schema registry: already running on 127.0.0.1:$PORT (pid $pid)"
      return 0
    fi
  else
    pid=""
  fi
  [ -f "$LIB/quarkus-run.jar" ] \
    || die "no Apicurio Registry in deploy/schema-registry/lib: run 'deploy/schema-registry/local.sh fetch' first"
  if [ -z "$pid" ]; then
    mkdir -p "$RUN"
    local opts=(
      -Xms64m -Xmx"$HEAP" -XX:+UseG1GC -Djava.awt.headless=true
      # Loopback only, HTTP and the management interface (health, metrics) alike.
      -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$PORT"
      -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$MANAGEMENT_PORT"
      # In-memory H2 (the default, spelled out) with a small pool: a single developer/test instance.
      -Dapicurio.storage.kind=sql -Dapicurio.storage.sql.kind=h2
      -Dapicurio.datasource.jdbc.initial-size=2 -Dapicurio.datasource.jdbc.min-size=2
      -Dapicurio.datasource.jdbc.max-size=20
      -Dapicurio.storage.snapshot.location="$RUN"
      # The shipped console format has a typo in its date (YYYY-MMx-dd).
      "-Dquarkus.log.console.format=%d{yyyy-MM-dd HH:mm:ss,SSS} %p [%c{3.}] (%t) %m%n"
    )
    # shellcheck disable=SC2206
    local extra=(${SCHEMA_REGISTRY_JAVA_OPTS:-})
    # setsid: the registry outlives the shell (and a test's process group) that started it. The inner shell
    # writes its own pid and then becomes the JVM (exec), so the pid file names the registry itself.
    rm -f "$PIDFILE"
    {
      echo "== $(date '+%F %T') start: $java ($(java_major "$java")) on 127.0.0.1:$PORT"
    } >>"$LOG"
    PIDFILE="$PIDFILE" setsid bash -c 'echo $$ >"$PIDFILE"; exec "$@"' _ \
      "$java" "${opts[@]}" "${extra[@]}" -jar "$LIB/quarkus-run.jar" >>"$LOG" 2>&1 </dev/null &
    local tries=0
    while [ ! -s "$PIDFILE" ] && [ "$tries" -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
    [ -s "$PIDFILE" ] || die "the registry process did not start (log: $LOG)"
    pid="$(cat "$PIDFILE")"
  fi
  local started=$SECONDS
  until ready; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$LOG" >&2
      die "the registry exited during start-up (log: $LOG)"
    fi
    if [ $((SECONDS - started)) -ge "$START_TIMEOUT" ]; then
      tail -n 30 "$LOG" >&2
      die "the registry did not answer GET $READY_PATH with 200 on 127.0.0.1:$PORT within ${START_TIMEOUT}s" \
        "(pid $pid still running, 'local.sh stop' ends it; log: $LOG)"
    fi
    sleep 0.5
  done
  echo "schema registry: running on 127.0.0.1:$PORT (pid $pid, ready after $((SECONDS - started))s," \
    "ccompat API http://127.0.0.1:$PORT/apis/ccompat/v7, logs in $RUN)"
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PIDFILE"
    echo "schema registry: not running on 127.0.0.1:$PORT"
    return 0
  fi
  stop_pid "schema registry" "$pid" "$PIDFILE" "$STOP_TIMEOUT" "127.0.0.1:$PORT"
}

status() {
  local pid
  if pid="$(running_pid)"; then
    echo "schema registry: running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  echo "schema registry: stopped (127.0.0.1:$PORT)"
  return 3
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  clean) stop; rm -rf "$RUN"; echo "schema registry: removed $RUN" ;;
  *) echo "usage: $0 fetch|start|stop|status|clean" >&2; exit 2 ;;
esac
