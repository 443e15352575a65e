#!/bin/sh
# Compiler launcher for the CUDA sources: runs the compile command it is given and
# keeps a copy of the compiler's diagnostics (the --resource-usage report: registers,
# stack, spills of every kernel) beside the object, as <object>.log, for
# tools/cuda_resource_usage.py. The diagnostics still reach the build output too.
obj=""
prev=""
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then obj="$arg"; fi
  prev="$arg"
done
if [ -z "$obj" ]; then exec "$@"; fi
"$@" 2>"$obj.log"
status=$?
cat "$obj.log" >&2
exit $status
