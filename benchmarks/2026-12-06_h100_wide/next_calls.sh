#!/usr/bin/env bash
# The next GPU session's calls, one part per call (each well under the 10-minute limit), from the repository root:
#   bash benchmarks/2026-12-06_h100_wide/next_calls.sh PART "$OUT"
# SITE (default /tmp/site): a folder of the packages the GPU machine lacks (hydra-core, flashrnn, ...), put on PYTHONPATH;
# for "heads", FlashRNN 1.0.8 in it patched to build on CUDA 13 (the team's peers/flashrnn_cuda13.py, run on SITE).
#   streams:   stack_timing.py on this tree and on a copy with next_wavefront.patch, side by side; then that copy's
#              stream tests (-m cuda, test_wavefront.py and the two-stream test of test_nn.py)
#   heads:     issue 39's table in one run: LSTM and sLSTM, bfloat16, heads 12 / 6 / 3 / 1 at FlashRNN's shape
#   sanitizer: the sanitizer test (slow) for the cells with wide kernels, racecheck, synccheck and memcheck
#   fast16:    next_fast_math_16bit.patch timed beside this tree (kernel_profile.py, two passes), then its 16-bit CUDA tests
set -u
PART=$1 OUT=$2
SITE=${SITE:-/tmp/site}
HERE=$PWD/benchmarks/2026-12-06_h100_wide
export PYTHONPATH=$PWD:$SITE TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
BUILD='import lltm_train.ops as o; assert o.load(), o.load_error()'
# patched_copy DIR PATCH LOG: this tree in DIR with PATCH applied; both trees' extensions built at once
patched_copy() {
  rm -rf "$1" && mkdir -p "$1" && cp -r csrc lltm_train tests conf pyproject.toml setup.py "$1/"
  (cd "$1" && patch -s -p1 < "$HERE/$2") || echo "$2 does not apply" >> "$3"
  python3 -c "$BUILD" >> "$3" 2>&1 &
  (cd "$1" && PYTHONPATH=$1:$SITE python3 -c "$BUILD") >> "$3" 2>&1 &
  wait
}
case $PART in
  streams)
    patched_copy /tmp/wave next_wavefront.patch "$OUT/streams.log"
    for tree in "$PWD" /tmp/wave; do
      echo "{\"tree\": \"$tree\"}" >> "$OUT/stacks.jsonl"
      (cd "$tree" && PYTHONPATH=$tree:$SITE python3 "$HERE/stack_timing.py" "$OUT/stacks.jsonl" > /dev/null 2>> "$OUT/streams.log")
    done
    (cd /tmp/wave && PYTHONPATH=/tmp/wave:$SITE timeout 240 python3 -m pytest -q -m cuda -p no:cacheprovider \
      tests/test_wavefront.py tests/test_nn.py 2>&1 | tail -n 15 >> "$OUT/streams.log") ;;
  heads)  # FlashRNN compiles its kernels per (cell, dtype, heads): all eight at once first
    for cell in lstm slstm; do
      for nh in 12 6 3 1; do
        python3 -c "import torch; from lltm_train.bench.peers import flashrnn_contender as f, try_contender as t
from lltm_train.ops.cells import CELLS; r = f(CELLS['$cell'], 1024, 16, 768, $nh, torch.device('cuda'), torch.bfloat16)
print('$cell $nh', t(r[1]) if r else 'absent')" >> "$OUT/heads_compile.log" 2>&1 &
      done
    done
    wait
    for cell in lstm slstm; do
      for nh in 12 6 3 1; do
        python3 -m lltm_train.bench --configs flashrnn-shape --cells $cell --dtype bfloat16 --num-heads $nh --repeats 7 \
          2>&1 | grep "flashrnn-shape" >> "$OUT/heads.log"
      done
    done ;;
  sanitizer)
    python3 -c "$BUILD" > "$OUT/sanitizer.log" 2>&1
    timeout 560 python3 -m pytest -q -n 8 -m slow -k "sanitizer and (lltm or lstm or gru)" tests/test_cuda.py \
      -p no:cacheprovider 2>&1 | tail -n 15 >> "$OUT/sanitizer.log" ;;
  fast16)  # next_fast_math_16bit.patch: the SFU math in every 16-bit persistent kernel, two passes beside this tree
    patched_copy /tmp/fast16 next_fast_math_16bit.patch "$OUT/fast16.log"
    SPECS=lstm:128:32:bf16,gru:128:32:fp16,lltm:128:32:bf16,lstm:512:32:bf16,slstm:512:16:bf16,lstm:768:16:fp16
    for tree in "$PWD" /tmp/fast16 /tmp/fast16 "$PWD"; do
      echo "{\"variant\": \"$tree\"}" >> "$OUT/fast16.jsonl"
      (cd "$tree" && PYTHONPATH=$tree:$SITE python3 "$HERE/kernel_profile.py" "$OUT/fast16.jsonl" "$SPECS" > /dev/null 2>> "$OUT/fast16.log")
    done
    (cd /tmp/fast16 && PYTHONPATH=/tmp/fast16:$SITE timeout 300 python3 -m pytest -q -n 4 -m "cuda and not slow" \
      -k "float16 or bfloat16 or bf16 or fp16 or half" tests -p no:cacheprovider 2>&1 | tail -n 5 >> "$OUT/fast16.log") ;;
  *) echo "unknown part $PART: streams, heads, sanitizer or fast16" >&2; exit 2 ;;
esac
