#!/bin/bash
# SPDX-License-Identifier: MIT
# gnmr-rank-env.sh COMMAND... — sets one training rank's GNMR agent
# settings from Slurm's environment and runs COMMAND. Global rank r =
# replica * TP + shard: replica 0 reports shard `shard` (GNMR_RANK, of
# GNMR_REPORTERS = TP), every other replica observes. The training code
# calls gnmr_agent_config_from_env() (or the Python adapter) to read them.
set -euo pipefail
: "${TP:?set TP, the model-parallel shards per replica}"
r=${SLURM_PROCID:?not under srun}
export GNMR_REPORTERS=$TP
export GNMR_RANK=$(( r % TP ))
if [ $(( r / TP )) -eq 0 ]; then
  export GNMR_OBSERVER=0
else
  export GNMR_OBSERVER=1
fi
# each node's agent key pair (gnmrctl keygen), listed in allowed_keys
if [ -r "${GNMR_KEYS:-/etc/gnmr}/node.key" ]; then
  key=${GNMR_KEYS:-/etc/gnmr}/node.key
  export GNMR_CURVE_PUBLIC_KEY=$(awk '/^public/ {print $3}' "$key")
  export GNMR_CURVE_SECRET_KEY=$(awk '/^secret/ {print $3}' "$key")
fi
exec "$@"
