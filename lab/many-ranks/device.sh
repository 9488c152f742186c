# Sourced by the device-call scripts here (session*.sh): `part` runs one bounded, logged part of a call and packs
# $work into $archive after it (a call cut off keeps what was done); `machine` writes what the machine is to a file.
# The caller sets out, work (made here), archive (.tgz or .txz: tar picks the compression by its suffix) and, if
# it wants more than 4, shown (log lines echoed after a part).
mkdir -p "$out" "$work"

part() {  # part NAME LIMIT command...
  local name=$1 limit=$2 t=$SECONDS
  shift 2
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,utilization.gpu --format=csv -lms 500 \
    > "$work/$name-clocks.csv" 2>/dev/null &
  local logger=$!
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  kill "$logger" 2>/dev/null
  echo "$name: exit $rc after $((SECONDS - t)) s (limit $limit s) at $(date -u +%H:%M:%S): $*" | tee -a "$work/steps.txt"
  tail -n "${shown:-4}" "$work/$name.log"
  tar caf "$archive" -C "$work" .
}

machine() {  # machine FILE
  { date -u; nvidia-smi; nvidia-smi topo -m; nproc; lscpu | head -20; free -g;
    python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), sys.version)"; } \
    > "$1" 2>&1
}
