#!/usr/bin/env bash
# One GPU call for the next_*.patch files of this folder: builds the tree as it is and with each patch (alone, then
# all four) in copies under /tmp, then times every build with kernel_profile.py, twice, the second pass in reverse
# order. Run from the repository root on a GPU machine; $SITE (default /tmp/site) is put on PYTHONPATH for packages
# the machine's Python lacks (e.g. `pip install --target /tmp/site hydra-core typeguard` where it has no hydra):
#   bash benchmarks/2026-12-06_h100_wide/try_patches.sh "$OUT" [SPECS]
# Writes $OUT/profile.jsonl (a {"variant": ...} line before each build's rows) and $OUT/builds.log; TESTS (below) adds tests.
set -u
OUT=$1
SPECS=${2:-lstm:768:16:fp16,lstm:1024:16:fp16,slstm:768:16:bf16}
SITE=${SITE:-/tmp/site}
HERE=$PWD/benchmarks/2026-12-06_h100_wide
declare -A PATCHES=([main]="" [fp24]="next_fp24_backward.patch" [spread]="next_spread_sums.patch"
                    [fast]="next_fast_math.patch" [poll]="next_poll_gpu_scope.patch"
                    [all]="next_fp24_backward.patch next_spread_sums.patch next_fast_math.patch next_poll_gpu_scope.patch")
VARIANTS=(main fp24 spread fast poll all)
for v in "${VARIANTS[@]}"; do
  dir=/tmp/variant_$v
  rm -rf "$dir" && mkdir -p "$dir" && cp -r csrc lltm_train pyproject.toml setup.py "$dir/"
  for p in ${PATCHES[$v]}; do (cd "$dir" && patch -s -p1 < "$HERE/$p") || echo "$v: $p does not apply" >> "$OUT/builds.log"; done
  (cd "$dir" && PYTHONPATH=$dir:$SITE MAX_JOBS=4 python3 -c "import lltm_train.ops as o; assert o.load(), o.load_error()" \
    > "/tmp/build_$v.log" 2>&1 || { echo "$v: build failed"; tail -n 20 "/tmp/build_$v.log"; } >> "$OUT/builds.log") &
done
wait
for order in "${VARIANTS[*]}" "$(printf '%s\n' "${VARIANTS[@]}" | tac | tr '\n' ' ')"; do
  for v in $order; do
    echo "{\"variant\": \"$v\"}" >> "$OUT/profile.jsonl"
    (cd "/tmp/variant_$v" && PYTHONPATH=/tmp/variant_$v:$SITE python3 "$HERE/kernel_profile.py" "$OUT/profile.jsonl" "$SPECS" \
      > /dev/null 2>> "$OUT/builds.log")
  done
done
# TESTS="all fp24" (say): the wide kernels' CUDA tests on those builds afterwards, a summary line each in builds.log.
for v in ${TESTS:-}; do
  (cd "/tmp/variant_$v" && cp -r "$OLDPWD/tests" . && PYTHONPATH=/tmp/variant_$v:$SITE timeout 300 python3 -m pytest -q -x \
    -m cuda -k "768 or 1024" tests -p no:cacheprovider 2>&1 | tail -n 1 | sed "s/^/$v tests: /" >> "$OUT/builds.log")
done
