#!/usr/bin/env bash
# The next GPU session's calls, one part per call (each well under the 10-minute limit), from the repository root:
#   bash benchmarks/2026-12-06_h100_wide/next_calls.sh PART "$OUT"
# SITE (default /tmp/site): a folder of the packages the GPU machine lacks (hydra-core, flashrnn, ...), put on PYTHONPATH;
# for "heads", FlashRNN 1.0.8 in it patched to build on CUDA 13 (the team's peers/flashrnn_cuda13.py, run on SITE).
#   first:     (not yet run: sessions 33 and 34 got too little device time) one call, about 8 minutes, of correctness and accuracy only: psMNIST with
#              zoneout at the recipe's 100 epochs (issue 40) beside the sLSTM and heads CUDA tests (issue 39) and the
#              small_input patch's tests; then, on the warm machine, small_input (its timing, alone on the GPU)
#   stacks:    stack_timing.py on this tree: each stack with and without its extra streams, side by side
#   heads:     issue 39's table in one run: LSTM and sLSTM, bfloat16, heads 12 / 6 / 3 / 1 at FlashRNN's shape
#   sanitizer: the sanitizer test (slow) for the cells with wide kernels, racecheck, synccheck and memcheck
#   best:      the status table's run (lltm-bench --dtype best at gpu-S..XL, every fused cell against cuDNN's fastest
#              dtype): issue 38's gpu-S (LLTM >= 1.3x the best of cuDNN's LSTM and GRU) and gpu-XL targets, with the SFU
#              math now in every 16-bit kernel
#   profile:   kernel_profile.py at FlashRNN's width (every kernel of a forward + backward and the idle time between
#              them: where the 0.8 ms beside the two recurrence kernels goes, issue 38's 1.3x at H 768), and at psMNIST's
#              shape, B 128 and 32 (issue 40's cuDNN 2x: a step of B 128 cost about 1.2x one of B 32 per time step)
#   prefetch:  ../2026-12-06_h100_s25/next_prefetch_{forward,both}.patch (the wide kernels' next-step loads a whole step
#              ahead) timed beside this tree (kernel_profile.py, passes main, forward, both, both, forward, main), then
#              the 16-bit CUDA tests on "both"
#   smnist:    issue 40: experiment=smnist_pixels alone on the GPU at the recipe's defaults (zoneout [0.5, 0.05], 190
#              epochs since 2026-12-07; EPOCHS overrides), its test accuracy in smnist.log, its CSV metrics into $OUT
#   pace:      issue 40's cuDNN 2x: one epoch of experiment=psmnist for backend cuda and torch at each precision (32-true,
#              16-mixed, bf16-mixed), alternated twice; the medians of the logged tokens/s and the peak memory in pace.jsonl
#   steps:     ../2026-12-07_s29/step_profile.py: psMNIST's step (model, loss, backward, clipping, fused AdamW) eagerly
#              for backend cuda and torch at each precision, B 128 and 256, its kernels by name
#   small_input: ../2026-12-07_s30/next_small_input_kernel.patch on a copy, timed beside this tree (step_profile.py, cuda,
#              float32 and bfloat16, B 128: captured, with cuDNN's captured step, then eager), then its CUDA tests at I 1
#              and in float64
#   cuda:      the extension's build, then every CUDA test (-m cuda), the sanitizer's runs beside the others
#   suite:     the extension's build, then the whole suite, -m SUITE_MARKERS (default 'cuda or not slow': the sanitizer
#              too, which alone fills most of a call), SUITE_LIMIT s
#   wave128:   stack_timing.py at width 128 (3 and 2 one-direction layers) with the wavefront from width 128 (today's rule:
#              from 256), captured and eager: issue 38's GRU 3 layers (1.05x cuDNN, captured, layer by layer)
#   smnist_pair: two runs of EXPERIMENT (default smnist_pixels) at once, at the recipe's epochs (EPOCHS overrides),
#              VARIANTS="overrides A|overrides B" (default zoneout [0.5, 0.05] and [0.15, 0.05]), logs and CSV metrics
#              into $OUT. Issue 40's psMNIST zoneout pair: EXPERIMENT=psmnist VARIANTS="model.zoneout=0|model.zoneout=[0.5,0.05]"
#   captured:  stack_timing.py --captured on this tree (one stream under capture), then
#              ../2026-12-06_h100_s25/next_captured_streams.patch (the stacks' streams inside a CUDA graph capture) applied
#              in place: its CUDA tests and stack_timing.py --captured again; the patch is reverted at the end
# (Session 25 ran heads, the wavefront and the 16-bit SFU math (then patches, now on main): benchmarks/2026-12-06_h100_s25/.)
set -u
PART=$1 OUT=$2
SITE=${SITE:-/tmp/site}
HERE=$PWD/benchmarks/2026-12-06_h100_wide
export PYTHONPATH=$PWD:$SITE TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
BUILD='import lltm_train.ops as o; assert o.load(), o.load_error()'
SI=$PWD/build/si  # a copy of the tree with the small_input patch (build/ is ignored: a warm machine keeps it, built)
si_tree() {  # makes $SI and builds its extension in the background (the caller waits); $1: the log
  rm -rf "$SI" && mkdir -p "$SI" && cp -r csrc lltm_train tests conf pyproject.toml setup.py "$SI"/
  (cd "$SI" && patch -s -p1 < "$HERE/../2026-12-07_s30/next_small_input_kernel.patch" && touch .patched) \
    || echo "next_small_input_kernel.patch does not apply" >> "$1"
  (cd "$SI" && PYTHONPATH=$SI:$SITE python3 -c "$BUILD") >> "$1" 2>&1 &
}
case $PART in
  stacks)
    python3 -c "$BUILD" > "$OUT/stacks.log" 2>&1
    python3 "$HERE/stack_timing.py" "$OUT/stacks.jsonl" > /dev/null 2>> "$OUT/stacks.log" ;;
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
  best)
    python3 -c "$BUILD" > "$OUT/best.log" 2>&1
    python3 -m lltm_train.bench --device cuda --dtype best --configs gpu-S,gpu-M,gpu-L,gpu-XL --json "$OUT/best.json" \
      2>&1 | grep -v "it/s" >> "$OUT/best.log" ;;
  profile)
    python3 -c "$BUILD" > "$OUT/profile.log" 2>&1
    python3 "$HERE/kernel_profile.py" "$OUT/profile.jsonl" lstm:768:16:fp16,slstm:768:16:bf16,lstm:1024:16:fp16,lstm:512:32:bf16,lstm:128:128:bf16:784:1,lstm:128:32:bf16:784:1 \
      > /dev/null 2>> "$OUT/profile.log" ;;
  prefetch)
    S25=$HERE/../2026-12-06_h100_s25
    for v in forward both; do
      rm -rf /tmp/pf_$v && mkdir -p /tmp/pf_$v && cp -r csrc lltm_train tests conf pyproject.toml setup.py /tmp/pf_$v/
      (cd /tmp/pf_$v && patch -s -p1 < "$S25/next_prefetch_$v.patch") || echo "next_prefetch_$v.patch does not apply" >> "$OUT/prefetch.log"
      (cd /tmp/pf_$v && PYTHONPATH=/tmp/pf_$v:$SITE python3 -c "$BUILD") >> "$OUT/prefetch.log" 2>&1 &
    done
    python3 -c "$BUILD" >> "$OUT/prefetch.log" 2>&1 &
    wait
    SPECS=lstm:768:16:fp16,slstm:768:16:bf16,gru:768:16:fp16,lltm:768:16:fp16,lstm:1024:16:fp16
    for tree in "$PWD" /tmp/pf_forward /tmp/pf_both /tmp/pf_both /tmp/pf_forward "$PWD"; do
      echo "{\"variant\": \"$tree\"}" >> "$OUT/prefetch.jsonl"
      (cd "$tree" && PYTHONPATH=$tree:$SITE python3 "$HERE/kernel_profile.py" "$OUT/prefetch.jsonl" "$SPECS" > /dev/null 2>> "$OUT/prefetch.log")
    done
    (cd /tmp/pf_both && PYTHONPATH=/tmp/pf_both:$SITE timeout 200 python3 -m pytest -q -n 4 -m "cuda and not slow" \
      -k "float16 or bfloat16 or bf16 or fp16 or half" tests -p no:cacheprovider 2>&1 | tail -n 5 >> "$OUT/prefetch.log") ;;
  smnist)
    python3 -c "$BUILD" > "$OUT/smnist.log" 2>&1
    timeout "${SMNIST_LIMIT:-570}" python3 -m lltm_train experiment=smnist_pixels backend=cuda trainer.accelerator=gpu \
      ${EPOCHS:+trainer.max_epochs=$EPOCHS} logger=csv hydra.run.dir=/tmp/smnist 2>&1 | tr '\r' '\n' \
      | grep -v -E "it/s|step/s" | tail -n 40 >> "$OUT/smnist.log"
    cp /tmp/smnist/csv/metrics.csv "$OUT/smnist_metrics.csv" ;;
  pace)
    python3 -c "$BUILD" > "$OUT/pace.log" 2>&1
    for round in 1 2; do
      for precision in 32-true 16-mixed bf16-mixed; do
        for backend in cuda torch; do
          dir=/tmp/pace_${backend}_${precision}_$round
          timeout 120 python3 -m lltm_train experiment=psmnist backend=$backend trainer.accelerator=gpu trainer.max_epochs=1 \
            trainer.precision=$precision test=false logger=csv hydra.run.dir=$dir > $dir.log 2>&1 \
            || { echo "== $backend $precision failed"; tail -n 5 $dir.log; } >> "$OUT/pace.log"
          python3 - "$dir/csv/metrics.csv" "$backend" "$precision" >> "$OUT/pace.jsonl" 2>> "$OUT/pace.log" <<'PY'
import csv, json, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tok = [float(r["throughput/tokens_per_s"]) for r in rows if r.get("throughput/tokens_per_s")]
mem = [float(r["memory/peak_cuda_mib"]) for r in rows if r.get("memory/peak_cuda_mib")]
print(json.dumps({"backend": sys.argv[2], "precision": sys.argv[3], "median_tokens_per_s": statistics.median(tok),
                  "logged": len(tok), "peak_mib": max(mem) if mem else None}))
PY
        done
      done
    done ;;
  steps)  # psMNIST's training step outside Lightning, kernel by kernel, cuda and torch at each precision (B 128, 256)
    python3 -c "$BUILD" > "$OUT/steps.log" 2>&1
    for b in 128 256; do
      python3 "$HERE/../2026-12-07_s29/step_profile.py" "$OUT/steps.jsonl" $b > /dev/null 2>> "$OUT/steps.log"
    done ;;
  small_input)  # ../2026-12-07_s30/next_small_input_kernel.patch (psMNIST's one input feature: the projection as one
    # outer-product kernel, dW_ih and db in one GEMM) on a copy (build/si; `first` made it on a warm machine), against
    # this tree: step_profile.py's cuda rows, alternated
    [ -f "$SI/.patched" ] || si_tree "$OUT/small_input.log"
    python3 -c "$BUILD" >> "$OUT/small_input.log" 2>&1 &
    wait
    for tree in "$PWD" "$SI" "$SI" "$PWD"; do  # captured (as Lightning trains), cuDNN's captured step beside main's
      [ "$tree" = "$PWD" ] && backends=cuda,torch || backends=cuda
      (cd "$tree" && STEP_GRAPH=1 STEP_TREE=$tree STEP_BACKENDS=$backends PYTHONPATH=$tree:$SITE \
        python3 "$HERE/../2026-12-07_s29/step_profile.py" "$OUT/small_input.jsonl" 128 > /dev/null 2>> "$OUT/small_input.log")
    done
    for tree in "$PWD" "$SI" "$SI" "$PWD"; do  # eager, with the kernels by name
      (cd "$tree" && STEP_TREE=$tree STEP_BACKENDS=cuda STEP_PRECISIONS=32-true,bf16-mixed PYTHONPATH=$tree:$SITE \
        python3 "$HERE/../2026-12-07_s29/step_profile.py" "$OUT/small_input.jsonl" 128 > /dev/null 2>> "$OUT/small_input.log")
    done
    (cd "$SI" && PYTHONPATH=$SI:$SITE timeout 120 python3 -m pytest -q -n 8 -m "cuda and not slow" \
      tests/test_ops.py tests/test_cuda.py -k "one_input or float64" -p no:cacheprovider 2>&1 | tail -n 4 >> "$OUT/small_input.log") ;;
  suite)  # the extension built first (about 2 minutes on a fresh machine), so the suite's limit is the tests' own
    python3 -c "$BUILD" > "$OUT/suite_gpu.log" 2>&1
    # -v: each test's name as it ends, so a run cut by the limit still says which tests had not finished
    LLTM_PYTHON=python3 timeout "${SUITE_LIMIT:-480}" scripts/test.sh -n 12 -v -p no:cacheprovider \
      -m "${SUITE_MARKERS:-cuda or not slow}" 2>&1 | tr '\r' '\n' \
      | grep --line-buffered -E "PASSED|FAILED|ERROR|SKIPPED|XFAIL|passed|failed|error" >> "$OUT/suite_gpu.log"
    echo "suite exit ${PIPESTATUS[0]}" >> "$OUT/suite_gpu.log" ;;
  cuda)  # every CUDA test in one call: the sanitizer's 18 (slow; SAN_K: a -k filter) on 8 workers beside the others on 7 (the CPU tests
    # passed on the GPU at ab95e86; the CUDA half of the closing rule's suite, about 7 minutes with the build)
    python3 -c "$BUILD" > "$OUT/cuda_suite.log" 2>&1
    (LLTM_PYTHON=python3 timeout "${SAN_LIMIT:-420}" scripts/test.sh -n 8 -v -p no:cacheprovider -m 'cuda and slow' \
      ${SAN_K:+-k "$SAN_K"} 2>&1 \
      | tr '\r' '\n' | grep --line-buffered -E "PASSED|FAILED|ERROR|passed|failed|error" > "$OUT/sanitizer.log"
     echo "sanitizer exit ${PIPESTATUS[0]}" >> "$OUT/sanitizer.log") &
    LLTM_PYTHON=python3 timeout "${CUDA_LIMIT:-420}" scripts/test.sh -n 7 -q -p no:cacheprovider -m 'cuda and not slow' \
      2>&1 | tr '\r' '\n' | grep -v "it/s" >> "$OUT/cuda_suite.log"; echo "cuda suite exit ${PIPESTATUS[0]}" >> "$OUT/cuda_suite.log"
    wait ;;
  wave128)  # the wavefront at width 128 inside a capture (no host time per piece), against layer by layer
    python3 -c "$BUILD" > "$OUT/wave128.log" 2>&1
    SPECS=gru:128:32:512:3:0:bf16,gru:128:32:512:3:0:fp32,lstm:128:32:512:3:0:bf16,gru:128:32:512:2:0:bf16
    # "streams" is then the wavefront, "one stream" layer by layer, alternated twice; eager too, for the host's share
    python3 "$HERE/stack_timing.py" "$OUT/wave128.jsonl" "$SPECS" --captured --min-width=128 > /dev/null 2>> "$OUT/wave128.log"
    python3 "$HERE/stack_timing.py" "$OUT/wave128.jsonl" "$SPECS" --min-width=128 > /dev/null 2>> "$OUT/wave128.log" ;;
  smnist_pair)  # two recipes at once (a shared GPU only slows each: each wall time bounds the time alone); VARIANTS
    # holds two override lists separated by "|"
    python3 -c "$BUILD" > "$OUT/smnist.log" 2>&1
    IFS='|' read -r A B <<< "${VARIANTS:-model.zoneout=[0.5,0.05]|model.zoneout=[0.15,0.05]}"
    i=0
    for v in "$A" "$B"; do
      i=$((i + 1))
      (timeout "${SMNIST_LIMIT:-540}" python3 -m lltm_train experiment="${EXPERIMENT:-smnist_pixels}" backend=cuda \
        trainer.accelerator=gpu ${EPOCHS:+trainer.max_epochs=$EPOCHS} logger=csv hydra.run.dir=/tmp/smnist_$i $v 2>&1 | tr '\r' '\n' \
        | grep -v -E "it/s|step/s" | tail -n 25 > /tmp/smnist_$i.log) &
    done
    wait
    for i in 1 2; do
      { echo "== variant $i"; cat /tmp/smnist_$i.log; } >> "$OUT/smnist.log"
      { echo "# variant $i"; cat /tmp/smnist_$i/csv/metrics.csv; } >> "$OUT/smnist_metrics.csv"
    done ;;
  captured)  # the patch touches Python, tests and docs only: applied in place (this is the device's copy), so the
    # extension built for this tree serves both runs
    python3 -c "$BUILD" >> "$OUT/captured.log" 2>&1
    echo '{"tree": "main"}' >> "$OUT/captured.jsonl"
    python3 "$HERE/stack_timing.py" "$OUT/captured.jsonl" --captured > /dev/null 2>> "$OUT/captured.log"
    patch -s -p1 < "$HERE/../2026-12-06_h100_s25/next_captured_streams.patch" \
      || { echo "next_captured_streams.patch does not apply" >> "$OUT/captured.log"; exit 1; }
    timeout 240 python3 -m pytest -q -m cuda -n 4 -p no:cacheprovider \
      tests/test_captured.py tests/test_wavefront.py tests/test_nn.py 2>&1 | tail -n 15 >> "$OUT/captured.log"
    echo '{"tree": "patched"}' >> "$OUT/captured.jsonl"
    python3 "$HERE/stack_timing.py" "$OUT/captured.jsonl" --captured > /dev/null 2>> "$OUT/captured.log"
    patch -s -R -p1 < "$HERE/../2026-12-06_h100_s25/next_captured_streams.patch" ;;
  first)  # the next session's first call, about 8 minutes (no timing: the GPU is shared): the extension built on this
    # tree and on a copy with ../2026-12-07_s30/next_small_input_kernel.patch (build/si, kept for `small_input` on a
    # warm machine); then at once psMNIST with zoneout at the recipe's 100 epochs (issue 40: >= 1 point above 91.90%;
    # PSMNIST overrides the variant), the sLSTM and heads CUDA tests on this tree (issue 39's last check) and the
    # patch's CUDA tests (one input feature, float64)
    python3 -c "$BUILD" > "$OUT/first.log" 2>&1 &
    si_tree "$OUT/first.log"
    wait
    # (its folder and log straight into $OUT: a call cut short by its limit still returns them)
    (timeout "${SMNIST_LIMIT:-480}" python3 -m lltm_train experiment=psmnist backend=cuda trainer.accelerator=gpu \
      ${EPOCHS:+trainer.max_epochs=$EPOCHS} logger=csv hydra.run.dir="$OUT/psmnist" ${PSMNIST:-model.zoneout=[0.5,0.05]} \
      2>&1 | tr '\r' '\n' | grep --line-buffered -v -E "it/s|step/s" > "$OUT/psmnist.log") &
    LLTM_PYTHON=python3 timeout 240 scripts/test.sh -n 6 -q -p no:cacheprovider -m cuda tests/test_slstm.py tests/test_heads.py \
      2>&1 | tail -n 6 >> "$OUT/first.log"
    (cd "$SI" && PYTHONPATH=$SI:$SITE timeout 150 python3 -m pytest -q -n 6 -m "cuda and not slow" \
      tests/test_ops.py tests/test_cuda.py -k "one_input or float64" -p no:cacheprovider 2>&1 | tail -n 4 >> "$OUT/first.log")
    wait
    { echo "== psMNIST ${PSMNIST:-model.zoneout=[0.5,0.05]}"; tail -n 25 "$OUT/psmnist.log"; } >> "$OUT/first.log" ;;
  *) echo "unknown part $PART: first, stacks, heads, sanitizer, best, profile, prefetch, smnist, pace, cuda, suite, wave128," \
       "smnist_pair, captured, steps or small_input" >&2; exit 2 ;;
esac
