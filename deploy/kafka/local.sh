#!/usr/bin/env bash
# A real single-node Apache Kafka (KRaft: broker + controller in one JVM) on 127.0.0.1, for development,
# tests and CI. Nothing is mocked: the jars are Apache Kafka's own, resolved from Maven Central by pom.xml.
#
#   deploy/kafka/local.sh fetch    resolve the broker jars into deploy/kafka/lib/ (idempotent, fast when done)
#   deploy/kafka/local.sh start    format storage if needed, start the broker, wait until it serves clients
#   deploy/kafka/local.sh stop     stop it (SIGTERM, a clean shutdown; SIGKILL after 30 s)
#   deploy/kafka/local.sh status   "running" (exit 0) or "stopped" (exit 3)
#   deploy/kafka/local.sh clean    stop it and delete its data directory
#
# Environment: KAFKA_PORT (client port, default 9092), KAFKA_CONTROLLER_PORT (default KAFKA_PORT + 1),
# KAFKA_HEAP (default 512m), KAFKA_START_TIMEOUT (seconds, default 90), KAFKA_CLUSTER_ID (forces the id that
# a first start formats storage with; default: a fresh one from Kafka's own generator).
# State lives in deploy/kafka/run/<KAFKA_PORT>/ (data/, broker.log, server.properties, broker.pid), so a
# broker for tests on a free port never touches the one a developer runs on 9092.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LIB="$HERE/lib"
M2="$HERE/.m2"
PORT="${KAFKA_PORT:-9092}"
CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
RUN="$HERE/run/$PORT"
PIDFILE="$RUN/broker.pid"
LOG="$RUN/broker.log"
HEAP="${KAFKA_HEAP:-512m}"
START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"

die() { echo "local.sh: $*" >&2; exit 1; }

fetch() {
  # A marker written after a complete copy keeps a re-run instant and an interrupted one retried.
  local marker="$LIB/.complete-$(sha256sum "$HERE/pom.xml" | cut -c1-16)"
  if [ -f "$marker" ]; then
    echo "kafka jars: present ($(ls "$LIB"/*.jar | wc -l) jars in deploy/kafka/lib)"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (Debian package 'maven')"
  command -v java >/dev/null 2>&1 || die "java not found: install a JDK 17+ (Debian package 'openjdk-17-jdk-headless')"
  rm -rf "$LIB"
  mkdir -p "$LIB"
  if ! mvn -q -B -f "$HERE/pom.xml" -Dmaven.repo.local="$M2" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIB" >"$HERE/.fetch.out" 2>&1; then
    cat "$HERE/.fetch.out" >&2
    die "resolving the Kafka jars from Maven Central failed (see the Maven output above)"
  fi
  rm -f "$HERE/.fetch.out"
  touch "$marker"
  echo "kafka jars: resolved $(ls "$LIB"/*.jar | wc -l) jars into deploy/kafka/lib"
}

running_pid() {
  # Prints the broker's pid when the pid file names a live Kafka JVM of this port.
  [ -f "$PIDFILE" ] || return 1
  local pid
  pid="$(cat "$PIDFILE")"
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  grep -q "kafka.Kafka" "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

accepts_clients() {
  # True once the broker answers a Metadata request with at least one live broker. A plain protocol probe
  # over bash's /dev/tcp (no Python, no JVM), so this works from any shell whatever python3 is on PATH.
  # Request: size 17, Metadata (api key 3) v4, correlation id 1, client id "rw", no topics, no auto-create.
  # Response v4: size, correlation id, throttle_time_ms, then the brokers array's int32 count.
  port_open || return 1
  local answer
  answer="$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf "\x00\x00\x00\x11\x00\x03\x00\x04\x00\x00\x00\x01\x00\x02rw\x00\x00\x00\x00\x00" >&3
    head -c 16 <&3 | od -An -tu1 -v' _ "$PORT" 2>/dev/null)" || return 1
  # shellcheck disable=SC2086
  set -- $answer
  [ "$#" -eq 16 ] || return 1
  [ "$5$6$7$8" = "0001" ] || return 1                      # our correlation id
  [ $(( ($13 << 24) | ($14 << 16) | ($15 << 8) | $16 )) -ge 1 ]  # at least one broker registered
}

new_cluster_id() {
  # Kafka's own generator (StorageTool random-uuid) never starts an id with '-' (Uuid.randomUuid()
  # regenerates such ids), which the StorageTool's option parser would take for an option.
  # KAFKA_CLUSTER_ID forces an id (tests force one with a leading '-', passed safely as --cluster-id=ID).
  if [ -n "${KAFKA_CLUSTER_ID:-}" ]; then
    echo "$KAFKA_CLUSTER_ID"
    return 0
  fi
  java_cmd kafka.tools.StorageTool random-uuid 2>>"$LOG" | tail -n 1
}

java_cmd() {
  local main="$1"; shift
  java -Xms128m -Xmx"$HEAP" -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$RUN/log4j2.properties" -Dkafka.logs.dir="$RUN" \
    -cp "$LIB/*" "$main" "$@"
}

write_config() {
  mkdir -p "$RUN/data"
  cat >"$RUN/server.properties" <<EOF
# Written by deploy/kafka/local.sh; single node, KRaft combined mode, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$RUN/data
num.partitions=1
# Topics are created on purpose (rankwatch simulate --create-topics, or the operator), never by a typo.
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# A single developer/test node: join a group at once instead of waiting 3 s for more members.
group.initial.rebalance.delay.ms=0
# A restarted node waits out its own previous registration (DUPLICATE_BROKER_REGISTRATION) for one broker
# session; short sessions make a broker restart take seconds instead of ~15 s.
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=2500
log.retention.hours=24
log.cleaner.enable=true
EOF
  cat >"$RUN/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $RUN/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
}

start() {
  local pid
  if pid="$(running_pid)"; then
    if accepts_clients; then
      echo "kafka: already running on 127.0.0.1:$PORT (pid $pid)"
      return 0
    fi
  else
    pid=""
  fi
  ls "$LIB"/kafka_2.13-*.jar >/dev/null 2>&1 \
    || die "no Kafka jars in deploy/kafka/lib: run 'deploy/kafka/local.sh fetch' first"
  if [ -z "$pid" ]; then
    write_config
    if [ ! -f "$RUN/data/meta.properties" ]; then
      # KRaft storage is formatted once with a fresh cluster id; a restart keeps the data.
      local cluster_id
      cluster_id="$(new_cluster_id)"
      [ -n "$cluster_id" ] || { tail -20 "$LOG" >&2; die "could not make a KRaft cluster id (log: $LOG)"; }
      # --cluster-id=ID in one word: an id starting with '-' is then never read as an option.
      java_cmd kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$RUN/server.properties" >>"$LOG" 2>&1 \
        || { tail -20 "$LOG" >&2; die "formatting KRaft storage failed (log: $LOG)"; }
    fi
    # setsid: the broker outlives the shell (and a test's process group) that started it. The inner shell
    # writes its own pid and then becomes the JVM (exec), so the pid file names the broker itself.
    rm -f "$PIDFILE"
    export RUN LIB HEAP PIDFILE
    setsid bash -c 'echo $$ >"$PIDFILE"; exec_java() { exec java -Xms128m -Xmx"$HEAP" -XX:+UseG1GC \
      -Djava.awt.headless=true -Dlog4j2.configurationFile="$RUN/log4j2.properties" -Dkafka.logs.dir="$RUN" \
      -cp "$LIB/*" kafka.Kafka "$RUN/server.properties"; }; exec_java' >>"$LOG" 2>&1 </dev/null &
    local tries=0
    while [ ! -s "$PIDFILE" ] && [ "$tries" -lt 50 ]; do sleep 0.1; tries=$((tries + 1)); done
    pid="$(cat "$PIDFILE")"
  fi
  local waited=0
  until accepts_clients; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -20 "$LOG" >&2
      die "the broker exited during start-up (log: $LOG, $RUN/server.log)"
    fi
    if [ "$waited" -ge "$START_TIMEOUT" ]; then
      die "the broker did not accept clients on 127.0.0.1:$PORT within ${START_TIMEOUT}s (log: $RUN/server.log)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "kafka: running on 127.0.0.1:$PORT (pid $pid, logs in $RUN)"
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PIDFILE"
    echo "kafka: not running on 127.0.0.1:$PORT"
    return 0
  fi
  kill -TERM "$pid"
  local waited=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge 300 ]; then
      echo "kafka: no clean shutdown after 30 s, killing pid $pid" >&2
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  rm -f "$PIDFILE"
  echo "kafka: stopped (127.0.0.1:$PORT)"
}

status() {
  local pid
  if pid="$(running_pid)"; then
    echo "kafka: running on 127.0.0.1:$PORT (pid $pid)"
    return 0
  fi
  echo "kafka: stopped (127.0.0.1:$PORT)"
  return 3
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  clean) stop; rm -rf "$RUN"; echo "kafka: removed $RUN" ;;
  *) echo "usage: $0 fetch|start|stop|status|clean" >&2; exit 2 ;;
esac
