#!/usr/bin/env bash
# Submit a valuation to a running Ray cluster as a Ray job and follow its logs.
#   cluster/submit.sh http://HEAD:8265 examples/demo.yaml [extra `convalue run` args]
# Token auth: the client must send the cluster's token. Either export RAY_AUTH_TOKEN=<token>, or keep it in
# ~/.ray/auth_token (where `ray get-auth-token --generate` writes it) and let this script set RAY_AUTH_MODE=token.
# The job runs CONVALUE_BIN on the head (default: `convalue`, found on the head's PATH); where the head's Ray was
# started outside the environment convalue is installed in, set it to that environment's script, e.g.
#   CONVALUE_BIN=/opt/venv/bin/convalue cluster/submit.sh ...
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DASHBOARD_ADDRESS CONFIG.yaml [convalue run args...]" >&2
  exit 2
fi
address=$1; config=$2; shift 2
if [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_MODE:-}" ] && [ -f "$HOME/.ray/auth_token" ]; then
  export RAY_AUTH_MODE=token
fi
cd "$(dirname "$0")/.."
exec ray job submit --address "$address" --working-dir . \
  --runtime-env-json '{"excludes": [".venv", "runs", ".git"], "env_vars": {"HF_HUB_OFFLINE": "1"}}' \
  -- "${CONVALUE_BIN:-convalue}" run "$config" "$@"
