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
#   KAFKA_SECURITY=sasl_ssl deploy/kafka/local.sh start
#                                  the same broker, secured (docs/security.md): beside PLAINTEXT on KAFKA_PORT (an
#                                  ANONYMOUS super user: the local admin's port, never for applications) a SASL_SSL
#                                  listener on KAFKA_SASL_PORT (SCRAM-SHA-512, TLS from a CA made here), ACLs on
#                                  (StandardAuthorizer, nothing allowed without an ACL). Users admin (super user),
#                                  rankwatch and intruder (no ACLs) with random passwords, made when storage is
#                                  formatted. Client files (ca.pem, <user>.password, client.properties,
#                                  admin.properties, README) are written to deploy/kafka/run/<KAFKA_PORT>/client/.
#   deploy/kafka/local.sh acls GROUP TOPIC [TOPIC...]
#                                  secured broker: grant User:rankwatch (KAFKA_ACL_USER) what `rankwatch run` with
#                                  group GROUP reading TOPICs needs: Read+Describe on each TOPIC, Read on group
#                                  GROUP, Create+Describe+Read+Write on topics prefixed "GROUP." (its checkpoint
#                                  and dead-letter topics), with Kafka's own AclCommand as admin over SASL_SSL
#
# Environment: KAFKA_PORT (client port, default 9092), KAFKA_CONTROLLER_PORT (default KAFKA_PORT + 1),
# KAFKA_HEAP (default 512m), KAFKA_START_TIMEOUT (seconds, default 90), KAFKA_CLUSTER_ID (forces the id that
# a first start formats storage with; default: a fresh one from Kafka's own generator).
# KAFKA_SECURITY (plaintext or sasl_ssl; default: what the run folder was formatted with, else plaintext; a
# formatted folder keeps its mode: `clean` first to change it), KAFKA_SASL_PORT (default KAFKA_PORT + 2),
# KAFKA_ACL_USER (the user `acls` grants to, default rankwatch).
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
SASL_PORT="${KAFKA_SASL_PORT:-$((PORT + 2))}"
TLS="$RUN/tls"
CLIENT="$RUN/client"
USERS="admin rankwatch intruder"
MECHANISM="SCRAM-SHA-512"

# shellcheck source=../lib.sh
. "$HERE/../lib.sh"  # die, maven_copy, fetch_marker, pid_from_file, stop_pid

fetch() {
  local marker
  marker="$(fetch_marker "$LIB" "$HERE/pom.xml")"
  if [ -f "$marker" ]; then
    echo "kafka jars: present ($(ls "$LIB"/*.jar | wc -l) jars in deploy/kafka/lib)"
    return 0
  fi
  command -v java >/dev/null 2>&1 || die "java not found: install a JDK 17+ (Debian package 'openjdk-17-jdk-headless')"
  rm -rf "$LIB"
  mkdir -p "$LIB"
  maven_copy "$HERE/pom.xml" "$M2" "$LIB" "the Kafka jars" -DincludeScope=runtime
  touch "$marker"
  echo "kafka jars: resolved $(ls "$LIB"/*.jar | wc -l) jars into deploy/kafka/lib"
}

running_pid() {
  # Prints the broker's pid when the pid file names a live Kafka JVM of this port.
  pid_from_file "$PIDFILE" "kafka.Kafka"
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
  local listeners="PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT"
  local advertised="PLAINTEXT://127.0.0.1:$PORT"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [ "$MODE" = sasl_ssl ]; then
    listeners="$listeners,SASL_SSL://127.0.0.1:$SASL_PORT"
    advertised="$advertised,SASL_SSL://127.0.0.1:$SASL_PORT"
    protocols="$protocols,SASL_SSL:SASL_SSL"
  fi
  cat >"$RUN/server.properties" <<EOF
# Written by deploy/kafka/local.sh; single node, KRaft combined mode, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
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
  if [ "$MODE" = sasl_ssl ]; then
    cat >>"$RUN/server.properties" <<EOF
# Secured (KAFKA_SECURITY=sasl_ssl): applications connect to SASL_SSL (SCRAM-SHA-512 over TLS, users made when
# storage was formatted). PLAINTEXT and CONTROLLER stay for the node itself and the local admin.
sasl.enabled.mechanisms=$MECHANISM
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.location=$TLS/broker-keystore.pem
listener.name.sasl_ssl.ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
# Every PLAINTEXT connection is User:ANONYMOUS: the broker's requests to its own controller, inter-broker
# traffic and the local admin on 127.0.0.1:$PORT. Without it the node cannot even register itself.
super.users=User:admin;User:ANONYMOUS
EOF
  fi
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

security_mode() {
  # Sets MODE. A formatted run folder keeps the mode it was formatted with ($RUN/security): storage without
  # SCRAM users cannot serve a secured listener, and a secured broker must not quietly come back open.
  local recorded="" requested
  if [ -f "$RUN/data/meta.properties" ]; then
    recorded="$(cat "$RUN/security" 2>/dev/null || echo plaintext)"
  fi
  requested="$(printf '%s' "${KAFKA_SECURITY:-}" | tr '[:upper:]' '[:lower:]')"
  case "$requested" in
    "") MODE="${recorded:-plaintext}" ;;
    plaintext | sasl_ssl) MODE="$requested" ;;
    *) die "KAFKA_SECURITY must be 'plaintext' or 'sasl_ssl', not '${KAFKA_SECURITY}'" ;;
  esac
  if [ -n "$recorded" ] && [ "$MODE" != "$recorded" ]; then
    die "$RUN was formatted as $recorded; run 'deploy/kafka/local.sh clean' first to start it as $MODE"
  fi
}

make_tls() {
  # A CA and a broker certificate for 127.0.0.1 and localhost, made once per run folder (clients keep their
  # ca.pem across restarts). The broker reads its key and chain from one PEM file (ssl.keystore.type=PEM).
  [ -s "$TLS/broker-keystore.pem" ] && [ -s "$TLS/ca.pem" ] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl not found: install it (Debian package 'openssl')"
  rm -rf "$TLS"
  mkdir -p "$TLS"
  chmod 700 "$TLS"
  (
    cd "$TLS"
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -keyout ca.key -out ca.pem \
      -subj "/CN=rankwatch local Kafka CA (port $PORT)" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout broker.key -out broker.csr -subj "/CN=localhost"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" "subjectAltName=DNS:localhost,IP:127.0.0.1" \
      "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid,issuer" >broker.ext
    openssl x509 -req -sha256 -days 825 -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
      -extfile broker.ext -out broker.crt
    cat broker.key broker.crt ca.pem >broker-keystore.pem
    chmod 600 ca.key broker.key broker-keystore.pem
  ) >>"$LOG" 2>&1 || die "making the TLS CA and broker certificate failed (log: $LOG)"
}

new_passwords() {
  # Random SCRAM passwords, one file per user (mode 600); made whenever storage is formatted.
  mkdir -p "$CLIENT"
  local user
  for user in $USERS; do
    (umask 077 && openssl rand -hex 16 >"$CLIENT/$user.password")
  done
}

password() {
  [ -s "$CLIENT/$1.password" ] || die "$CLIENT/$1.password is missing; 'deploy/kafka/local.sh clean' makes new users"
  tr -d '\n' <"$CLIENT/$1.password"
}

write_client_files() {
  # What a client needs, rewritten at every secured start (the SASL port may change; the passwords do not).
  local boot="127.0.0.1:$SASL_PORT" admin_pw
  admin_pw="$(password admin)"
  mkdir -p "$CLIENT"
  cp "$TLS/ca.pem" "$CLIENT/ca.pem"
  cat >"$CLIENT/client.properties" <<EOF
# The secured listener of the local broker (deploy/kafka/local.sh, docs/security.md), for Java clients.
# Users: admin (super user), rankwatch (ACLs from 'local.sh acls'), intruder (no ACLs: for denial tests).
# Passwords: $CLIENT/<user>.password
bootstrap.servers=$boot
security.protocol=SASL_SSL
sasl.mechanism=$MECHANISM
ssl.truststore.type=PEM
ssl.truststore.location=$CLIENT/ca.pem
# sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="rankwatch" password="<rankwatch.password>";
EOF
  (umask 077 && cat >"$CLIENT/admin.properties" <<EOF
# The admin super user over SASL_SSL, e.g. for Kafka's tools: kafka-acls.sh --command-config admin.properties
bootstrap.servers=$boot
security.protocol=SASL_SSL
sasl.mechanism=$MECHANISM
ssl.truststore.type=PEM
ssl.truststore.location=$CLIENT/ca.pem
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
EOF
  )
  cat >"$CLIENT/README" <<EOF
Local secured Kafka broker (deploy/kafka/local.sh, KAFKA_SECURITY=sasl_ssl); see docs/security.md.

SASL_SSL bootstrap: $boot   (applications)
PLAINTEXT:          127.0.0.1:$PORT   (User:ANONYMOUS, a super user: the local admin only)
SASL mechanism:     $MECHANISM
TLS CA (PEM):       $CLIENT/ca.pem   (ssl_cafile; the broker certificate names 127.0.0.1 and localhost)
Users:              admin (super user), rankwatch (grant with 'local.sh acls GROUP TOPIC...'), intruder (no ACLs)
Passwords:          $CLIENT/admin.password, $CLIENT/rankwatch.password, $CLIENT/intruder.password
Java tools:         client.properties (no password), admin.properties (as admin, for --command-config)
Client examples:    docs/security.md
EOF
}

sasl_port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$SASL_PORT") 2>/dev/null
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
    [ "$MODE" = sasl_ssl ] && make_tls
    if [ ! -f "$RUN/data/meta.properties" ]; then
      # KRaft storage is formatted once with a fresh cluster id; a restart keeps the data.
      local cluster_id
      cluster_id="$(new_cluster_id)"
      [ -n "$cluster_id" ] || { tail -20 "$LOG" >&2; die "could not make a KRaft cluster id (log: $LOG)"; }
      # Secured: the SCRAM users go into the first metadata records (no broker is needed to create them).
      local scram=() user
      if [ "$MODE" = sasl_ssl ]; then
        new_passwords
        for user in $USERS; do
          scram+=(--add-scram "$MECHANISM=[name=$user,password=$(password "$user")]")
        done
      fi
      # --cluster-id=ID in one word: an id starting with '-' is then never read as an option.
      java_cmd kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$RUN/server.properties" \
        "${scram[@]}" >>"$LOG" 2>&1 \
        || { tail -20 "$LOG" >&2; die "formatting KRaft storage failed (log: $LOG)"; }
      echo "$MODE" >"$RUN/security"
    fi
    [ "$MODE" = sasl_ssl ] && write_client_files
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
  until accepts_clients && { [ "$MODE" != sasl_ssl ] || sasl_port_open; }; do
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
  if [ "$MODE" = sasl_ssl ]; then
    echo "kafka: SASL_SSL on 127.0.0.1:$SASL_PORT ($MECHANISM; users admin, rankwatch, intruder); CA, passwords" \
      "and client.properties in $CLIENT (see its README)"
  fi
}

stop() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$PIDFILE"
    echo "kafka: not running on 127.0.0.1:$PORT"
    return 0
  fi
  stop_pid kafka "$pid" "$PIDFILE" 30 "127.0.0.1:$PORT"
}

status() {
  local pid
  if pid="$(running_pid)"; then
    echo "kafka: running on 127.0.0.1:$PORT (pid $pid)"
    if [ "$(cat "$RUN/security" 2>/dev/null)" = sasl_ssl ] && [ -f "$CLIENT/admin.properties" ]; then
      echo "kafka: secured, SASL_SSL on $(sed -n 's/^bootstrap.servers=//p' "$CLIENT/admin.properties") (client files in $CLIENT)"
    fi
    return 0
  fi
  echo "kafka: stopped (127.0.0.1:$PORT)"
  return 3
}

acls() {
  # Kafka's own AclCommand (kafka-acls.sh; in kafka-tools since Kafka 4) as admin over SASL_SSL: the same
  # commands docs/security.md gives for a real cluster.
  [ "$#" -ge 2 ] || { echo "usage: $0 acls GROUP TOPIC [TOPIC...]" >&2; exit 2; }
  [ "$(cat "$RUN/security" 2>/dev/null)" = sasl_ssl ] \
    || die "acls: the broker of $RUN is not secured (start it with KAFKA_SECURITY=sasl_ssl)"
  running_pid >/dev/null || die "acls: no broker running on 127.0.0.1:$PORT"
  [ -s "$CLIENT/admin.properties" ] || die "acls: $CLIENT/admin.properties is missing (start the broker again)"
  local group="$1"; shift
  local principal="User:${KAFKA_ACL_USER:-rankwatch}" topic topics=()
  for topic in "$@"; do topics+=(--topic "$topic"); done
  local conn=(--bootstrap-server "$(sed -n 's/^bootstrap.servers=//p' "$CLIENT/admin.properties")"
              --command-config "$CLIENT/admin.properties")
  acl_tool "${conn[@]}" --add --allow-principal "$principal" --operation Read --operation Describe "${topics[@]}"
  acl_tool "${conn[@]}" --add --allow-principal "$principal" --operation Read --group "$group"
  acl_tool "${conn[@]}" --add --allow-principal "$principal" --operation Create --operation Describe \
    --operation Read --operation Write --resource-pattern-type prefixed --topic "$group."
  acl_tool "${conn[@]}" --list --principal "$principal"
}

acl_tool() {
  java_cmd org.apache.kafka.tools.AclCommand "$@" 2>>"$LOG" || die "kafka-acls failed (log: $LOG)"
}

case "${1:-}" in
  fetch) fetch ;;
  start) security_mode; start ;;
  stop) stop ;;
  status) status ;;
  clean) stop; rm -rf "$RUN"; echo "kafka: removed $RUN" ;;
  acls) shift; acls "$@" ;;
  *) echo "usage: $0 fetch|start|stop|status|clean|acls GROUP TOPIC..." >&2; exit 2 ;;
esac
