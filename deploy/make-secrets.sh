#!/bin/sh
# Secrets for docker-compose.yml and clickhouse/docker-compose.yml, written to deploy/secrets/
# (which git ignores):
#
#   tokens                  the server's tokens file, one `SCOPE TOKEN [hosts=...]` line per client
#   agent_token             the agent's token: write scope, bound to the agent's --host (AGENT_HOST)
#   write_token             a write token for any host, for imports from elsewhere: delete its line
#                           from tokens where nobody needs one
#   read_token              the explorer's token (read scope)
#   admin_token             for people: tracehouse query and import (read and write)
#   clickhouse_password     the ClickHouse user `tracehouse`'s password, for serve --store-password-file
#   clickhouse.env          the same for the single ClickHouse server (the image's CLICKHOUSE_PASSWORD)
#   clickhouse-cluster.env  the same for the cluster nodes, and the secret they share
#
# Files that exist are kept, so running it again changes nothing (but for adding what a newer
# version of this script makes); delete deploy/secrets/ to start over (and restart everything,
# since the ClickHouse volume keeps the old password).
#
# A write token bound to a host writes only that host's rows and runs (docs/how-to/security.md). On
# more GPU hosts, give each agent its own line, made on the server:
#   tracehouse token --scope write --hosts gpu-17 >> tokens    # then the TOKEN alone to gpu-17
#
# Compose mounts secret files into the containers as they are on this machine, and the
# tracehouse containers run as uid 10001: the files are readable by all (serve says so in its
# log), and the folder that holds them is yours alone.
set -eu
AGENT_HOST=${AGENT_HOST:-simulated-gpu-host}  # the --host of the agent in the compose files
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets

random_token() {  # what `tracehouse token` makes: 32 random bytes, URL-safe base64
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import secrets; print(secrets.token_urlsafe(32))'
    else
        openssl rand -base64 32 | tr '+/' '-_' | tr -d '=\n'
        echo
    fi
}

token_line() {  # a `SCOPE TOKEN` line
    if command -v tracehouse >/dev/null 2>&1; then
        tracehouse token --scope "$1"
    else
        echo "$1 $(random_token)"
    fi
}

agent_token_line() {  # a `write TOKEN hosts=HOST` line: a write token for host $1 alone
    if command -v tracehouse >/dev/null 2>&1; then
        tracehouse token --scope write --hosts "$1"
    else
        echo "write $(random_token) hosts=$1"
    fi
}

if [ ! -f secrets/tokens ]; then
    : > secrets/tokens.new
    for scope in write read admin; do
        line=$(token_line "$scope")
        echo "$line" >> secrets/tokens.new
        echo "${line#* }" > "secrets/${scope}_token"
    done
    mv secrets/tokens.new secrets/tokens
fi
if [ ! -f secrets/agent_token ]; then
    line=$(agent_token_line "$AGENT_HOST")
    echo "$line" | cut -d' ' -f2 > secrets/agent_token.new
    echo "$line" >> secrets/tokens
    mv secrets/agent_token.new secrets/agent_token
fi
[ -f secrets/clickhouse_password ] || random_token > secrets/clickhouse_password
password=$(cat secrets/clickhouse_password)
[ -f secrets/clickhouse.env ] || echo "CLICKHOUSE_PASSWORD=$password" > secrets/clickhouse.env
if [ ! -f secrets/clickhouse-cluster.env ]; then
    {
        echo "CLICKHOUSE_TRACEHOUSE_PASSWORD=$password"
        echo "CLICKHOUSE_CLUSTER_SECRET=$(random_token)"
    } > secrets/clickhouse-cluster.env
fi
chmod 644 secrets/tokens secrets/agent_token secrets/write_token secrets/read_token secrets/admin_token \
    secrets/clickhouse_password
echo "secrets in $(pwd)/secrets:"
ls -l secrets
