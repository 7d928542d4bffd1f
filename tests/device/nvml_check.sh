#!/bin/bash
# The GPU check (issues 3 and 9), run on a lent GPU machine through the `device` tool:
#   run(command="bash tests/device/nvml_check.sh", carry=[".whl"], timeout_s=420)
# 1. `tracehouse agent` with the real NVML backend for 60 s against a server that is away,
#    while tests/device/gpu_load.py loads the GPU for 25 s in the middle;
# 2. `tracehouse run --agent start` of gpu_load.py with one spawned child (real per-process
#    memory and utilisation from NVML, attributed to the run's process tree), server away.
# Both spools come back in $OUT/spools.tar.gz, to replay into a real server here.
set -u
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export TRACEHOUSE_HOME=/tmp/th
AWAY=127.0.0.1:9
mkdir -p $TRACEHOUSE_HOME
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv;
  python3 -c "import sys, grpc, google.protobuf as p, pynvml, psutil, torch; print(sys.version, grpc.__version__, p.__version__, torch.__version__)"; } 2>&1 | tee $OUT/env.txt
if [ -z "${RUN_ONLY:-}" ]; then  # RUN_ONLY=1: only step 2
  python3 -m tracehouse.cli.main agent --server $AWAY --duration 60 --spool $TRACEHOUSE_HOME/agent-spool >$OUT/agent.json 2>$OUT/agent.log &
  AGENT=$!
  sleep 15
  python3 tests/device/gpu_load.py --seconds 25 >$OUT/load1.json 2>&1
  wait $AGENT
  echo "agent exit $?"
fi
python3 -m tracehouse.cli.main -v run --server $AWAY --agent start --name h200-matmul --gpus 0 --tag check=device \
  -- python3 tests/device/gpu_load.py --seconds 20 --children 1 >$OUT/run.out 2>$OUT/run.log
echo "run exit $?"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>$OUT/env.txt 2>&1
tar czf $OUT/spools.tar.gz -C $TRACEHOUSE_HOME .
ls -la $OUT; tail -n 5 $OUT/run.log; cat $OUT/run.out
