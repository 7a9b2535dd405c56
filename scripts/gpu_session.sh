#!/usr/bin/env bash
# One device call: GPU tests, the tile sweep and the benchmark, logs under $OUT (or ./results).
# Usage: bash scripts/gpu_session.sh [tests] [fwd-tests] [check-hopper] [tune] [tune-hopper] [tune-bwd] [lessons] [bench]
#        [bench-quick] [ncu-fwd] [ncu-decode] [clock-probe] [tier-bwd] [tier-rest] [tier-fwd] [redesign-bench] [redesign-decode]
#        [short-step] [host-parts] [short-design] [sinks] [flash-attn-tests] [pipeline-record] [bwd-candidate]
#        [ncu-bwd-peers] [kept-replays] [bench-warmup] [padded-tests] [padded-bench] [window-tests]
#        [window-bench] [window-fwd-tests] [softcap-tests] [softcap-bench] [window-fwd-ab]
#        [softcap-fwd-ab] [window-bwd-ab] [varlen-zero] [tree-ab]
# tier-bwd, tier-rest, tier-fwd: the whole GPU tier in three calls (on a cold Triton cache it does not fit fewer):
# each file in parallel workers, the forward's largest tests in three.
# redesign-bench, redesign-decode: the package before issue 38's redesign against this tree's (run
# `mkdir -p .before && git archive e8d4ab3 flashtile | tar -x -C .before` here first and carry .before); tree-ab: the
# same with any tree in .before (e.g. `git archive main flashtile` for a branch) and TREE_AB_ARGS (the bench's
# arguments, e.g. "--backward --head-dims 96 192 --seqlens 2048 8192") and TREE_AB_RUNS (its turns, ABBAAB unless
# given, e.g. "before-1 after-1 after-2 before-2").
set -u
out=${OUT:-results}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # (a PYTHONPATH given, e.g. FA4's, kept)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
for step in "$@"; do
  case $step in
    tests) python3 -m pytest -m gpu -q -p no:cacheprovider tests 2>&1 | tail -40 | tee "$out/tests.log" ;;
    fwd-tests) for part in "frozen_max or test_large or early_p" \
                           "not (frozen_max or test_large or early_p)"; do  # each within a device call
                 timeout 280 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
                   -k "not portable and ($part)" 2>&1 | grep -v "warner\|BenchmarkWarning" | tail -80 \
                   | tee -a "$out/fwd-tests.log"
               done ;;
    tier-bwd) timeout 450 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf \
                tests/kernels/hopper/test_bwd.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tee -a "$out/tier.log" ;;
    tier-rest) mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
              for f in portable/test_bwd portable/test_decode; do  # test_decode: out of memory at -n 12 on 80 GB
                n=12; [ $f = portable/test_decode ] && [ "${mib:-0}" -lt 100000 ] && n=6
                timeout 150 python3 -m pytest -m gpu -q -n $n -p no:cacheprovider --tb=short -rf tests/kernels/$f.py \
                  2>&1 | grep -E "passed|failed|FAILED|Error" | tee -a "$out/tier.log"
              done
              timeout 240 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=short -rf \
                --ignore-glob "tests/kernels/*/test_[bdf]*.py" tests 2>&1 | grep -E "passed|failed|FAILED|Error" \
                | tee -a "$out/tier.log" ;;
    tier-fwd) heavy="q_in_registers or o_through_the_last_k_tile or claims"  # out of memory at -n 12
              heavy="$heavy or schedule_options_off or (test_large and n16384)"
              timeout 290 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
                -k "not ($heavy)" 2>&1 | grep -E "passed|failed|FAILED|Error" | tee -a "$out/tier.log"
              timeout 290 python3 -m pytest -m gpu -q -n 3 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
                -k "$heavy" 2>&1 | grep -E "passed|failed|FAILED|Error" | tee -a "$out/tier.log" ;;
    tune) python3 -m flashtile.bench.tune 2>&1 | grep -v '%|' | tee "$out/tune.log" ;;
    tune-bwd) python3 -m flashtile.bench.tune --backward --seqlens 4096 16384 2>&1 | grep -v '%|' \
                | tee "$out/tune-bwd.log" ;;
    check-hopper) python3 scripts/check_hopper.py 2>&1 | tee "$out/check-hopper.log" ;;
    tune-hopper) python3 -m flashtile.bench.tune --hopper --seqlens 4096 16384 2>&1 | grep -v '%|' \
                   | tee "$out/tune-hopper.log" ;;
    lessons) python3 -m flashtile.bench.lessons 2>&1 | tee "$out/lessons.log" ;;
    bench) python3 -m flashtile.bench --backward --peers flashtile "flashtile (portable)" cuDNN "FA2 (SDPA flash)" \
             FlexAttention --memory-seqlens 8192 16384 32768 65536 131072 --out "$out/bench" 2>&1 \
             | grep -v '%|' | tee "$out/bench.log" ;;
    ncu-fwd) for shape in "8192 128" "16384 64"; do
               read -r n d <<< "$shape"
               timeout 240 ncu --clock-control none --profile-from-start off --set full --import-source yes \
                 -o "$out/fwd-d$d-n$n" python3 scripts/ncu_fwd.py --seqlen "$n" --head-dim "$d" > /dev/null 2>&1
               ncu --import "$out/fwd-d$d-n$n.ncu-rep" --page source --csv --print-source sass > "$out/sass.csv"
               python3 scripts/ncu_stalls.py "$out/sass.csv" 20 | tee "$out/ncu-fwd-d$d-n$n-stalls.txt"
             done ;;
    ncu-decode) for shape in "32 4096" "32 32768" "8 131072"; do
                  read -r b n <<< "$shape"
                  timeout 120 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
                    --section LaunchStats --section MemoryWorkloadAnalysis --section Occupancy -o "$out/dec-b$b-n$n" \
                    python3 tools/ncu_decode.py --batch "$b" --seqlen "$n" > /dev/null 2>&1
                  ncu --import "$out/dec-b$b-n$n.ncu-rep" --page details --csv > "$out/ncu-decode-b$b-n$n.csv"
                done ;;
    clock-probe) timeout 200 python3 scripts/clock_probe.py --seqlen 8192 --head-dim 128 --seconds 3 2>&1 \
                   | grep '^|' | tee "$out/clock-probe.md" ;;
    redesign-bench|redesign-decode|tree-ab)  # .before/flashtile (carried) against this tree, in turns: issue 38's
      # bar, or (tree-ab) any candidate on the bench's cells of $TREE_AB_ARGS
      runs=${TREE_AB_RUNS:-before-1 after-1 after-2 before-2 before-3 after-3}  # ABBAAB: neither tree always runs warmer
      for run in $runs; do
        tree=${run%-*} root=$PWD; [ $tree = before ] && root=$PWD/.before
        args="--backward --warm-gpu 5"; [ $step = tree-ab ] && args=${TREE_AB_ARGS:-$args}
        if [ $step != redesign-decode ]; then
          PYTHONPATH=$root timeout 150 python3 -m flashtile.bench $args --peers flashtile --memory-seqlens \
            --out "$out/runs/$run" 2>&1 | grep "^|" | tee -a "$out/redesign.log"
        else
          PYTHONPATH=$root timeout 140 python3 -m flashtile.bench.decode --rounds 2 --out "$out/runs/$run" 2>&1 \
            | grep "^|" | tee -a "$out/redesign.log"
        fi
      done
      side() { printf "$out/runs/%s\n" $runs | grep "/$1-" | paste -sd,; }  # a tree's runs, comma-separated
      bar=--bar; [ $step = tree-ab ] && bar=  # issue 38's bar, or (tree-ab) the numbers alone
      python3 scripts/redesign_compare.py $bar "$(side before)" "$(side after)" \
        | tee "$out/redesign-compare.md"
      # few files come back from a call: the runs' json in one archive
      rm -f "$out"/runs/*/*.png; tar -czf "$out/redesign-runs.tgz" -C "$out" runs && rm -rf "$out/runs" ;;
    short-step) for d in 128 64; do  # the step at N=512 against its kernels, with the sm90 and the portable backward
                  timeout 200 python3 scripts/step_host.py --seqlens 256 512 1024 --head-dim $d 2>&1 | grep "^|" \
                    | tee -a "$out/short-step.md"
                  timeout 100 python3 scripts/step_profile.py --seqlens 256 512 1024 --head-dim $d 2>&1 | grep "^|" \
                    | tee -a "$out/short-step.md"
                done ;;
    short-design) timeout 240 python3 scripts/bwd_design_ab.py single_pass=0 --seqlens 256 512 1024 2>&1 | grep "^|" \
                    | tee "$out/short-design.md" ;;  # two kernels against one pass where the step is short
    sinks) timeout 230 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
             tests/kernels/hopper/test_bwd.py -k "sinks or varlen or large_logits" 2>&1 \
             | grep -E "passed|failed|FAILED|Error" | tee -a "$out/sinks.log"
           timeout 120 python3 -m flashtile.bench --backward --peers flashtile "flashtile (sinks)" --memory-seqlens \
             --warm-gpu 5 --out "$out/sinks-bench" 2>&1 | grep "^|" | tee -a "$out/sinks.log"
           rm -f "$out"/sinks-bench/*.png ;;  # learnable_sink: its GPU tests, then its speed against none
    flash-attn-tests)  # flash-attn 2.8.3's tests/test_flash_attn.py, unchanged, on flashtile (issue 39): first
      # `git show v2.8.3:tests/test_flash_attn.py > .fa/test_flash_attn.py` from a flash-attention clone, the einops
      # wheel in .whl/, and carry .fa and .whl. FA_TESTS_K narrows the cases (-k), FA_TESTS_SAMPLE=i/n takes every n-th
      # (tools/flash_attn_conftest.py), FA_TESTS_S bounds the seconds; dropout cases are left out.
      pip install --no-deps -q .whl/einops-*.whl 2>&1 | tail -1
      cp tools/flash_attn_conftest.py .fa/conftest.py
      out=$(realpath -m "$out")  # the tests run in .fa
      (cd .fa && FA_TIMES="$out/fa-times.tsv" timeout -s INT "${FA_TESTS_S:-540}" python3 -m pytest -v -n 16 --dist worksteal \
         -p no:cacheprovider --tb=line -rf --durations=40 test_flash_attn.py -k "not 0.17 and (${FA_TESTS_K:-test_})" \
         > "$out/fa-tests-full.log" 2>&1)
      python3 tools/fa_failures.py < "$out/fa-tests-full.log" \
        | tee -a "$out/flash-attn-tests.log"
      python3 tools/fa_times.py "$out/fa-times.tsv" | tee -a "$out/flash-attn-tests.log" && gzip -f "$out/fa-times.tsv"
      # sixteen workers share the GPU's memory: a failure may be another worker's out-of-memory, so run them again, two
      # at a time
      mapfile -t again < <(grep -oE "^FAILED [^ ]+" "$out/fa-tests-full.log" | cut -d' ' -f2 | head -100)
      if [ ${#again[@]} -gt 0 ]; then
        (cd .fa && timeout "${FA_RERUN_S:-150}" python3 -m pytest -v -n 2 -p no:cacheprovider --tb=short -rf "${again[@]}" \
           > "$out/fa-tests-rerun.log" 2>&1)
        echo "the failures again, two workers:" | tee -a "$out/flash-attn-tests.log"
        python3 tools/fa_failures.py < "$out/fa-tests-rerun.log" | tee -a "$out/flash-attn-tests.log"
        gzip -f "$out/fa-tests-rerun.log"
      fi
      gzip -f "$out/fa-tests-full.log" ;;
    host-parts) timeout 120 python3 scripts/step_host.py --parts 2>&1 | tee "$out/host-parts.md" ;;
    padded-tests)  # head dims below their tiles' (40, 80, 96, 192) on the sm90 kernels: their GPU tests, with the
      # kernels' own tests at D=64/128/256 that share the changed code (FROZEN_MAX's redo, the common layouts)
      timeout 300 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf tests/kernels/hopper \
        -k "d40 or d80 or d96 or d192 or padded or covers_the_common or taken_for or frozen_max" 2>&1 | tee "$out/padded-tests-full.log" \
        | grep -E "passed|failed|FAILED|Error" | tee "$out/padded-tests.log" ;;
    window-tests)  # sliding windows (both designs, D=64 to 256, packed) and softcap (D=192, 256) on the sm90 backward
      timeout 300 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_bwd.py \
        -k "window or test_gradients or deterministic or packed_sequences or softcap" 2>&1 | tee "$out/window-tests-full.log" \
        | grep -E "passed|failed|FAILED|Error" \
        | tee "$out/window-tests.log" ;;
    window-fwd-tests)  # sliding windows and softcap on the sm90 forward (D=64 to 256, bf16 and fp16, short lengths),
      # with the forward's tests of the code the window touched (the three-warpgroup items, FROZEN_MAX, claims)
      timeout 300 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
        -k "not portable and (window or softcap or three_consumer or d64_causal or frozen_max or ragged or covers_the_common)" \
        2>&1 | tee "$out/window-fwd-tests-full.log" | grep -E "passed|failed|FAILED|Error" | tee "$out/window-fwd-tests.log" ;;
    padded-bench)  # D=96 and 192 against the portable kernels (the path before), FA4 (where PYTHONPATH has it),
      # cuDNN and FA2
      timeout 280 python3 -m flashtile.bench --backward --head-dims 96 192 --seqlens 1024 4096 16384 --rounds 1 --memory-seqlens \
        --peers flashtile "flashtile (portable)" FA4 cuDNN "FA2 (SDPA flash)" --out "$out/bench-padded" 2>&1 \
        | grep "^|" | tee "$out/padded-bench.log" ;;
    window-bench)  # sliding windows: the sm90 kernels against the portable ones (the path before) and FA4 (where
      # PYTHONPATH has it)
      for w in "256 0" "4096 0"; do
        timeout 140 python3 -m flashtile.bench --backward --window $w --head-dims 64 128 --seqlens 4096 16384 \
          --rounds 1 --memory-seqlens --peers flashtile "flashtile (portable)" FA4 --out "$out/bench-window-${w// /_}" 2>&1 \
          | grep "^|" | tee -a "$out/window-bench.log"
      done ;;
    window-fwd-ab)  # the forward under narrow windows (configs.FWD_HOPPER's min_window): the portable kernel against the
      # sm90 entries and candidates (D=64 in 128 rows with FROZEN_MAX, D=128 in 64-key tiles)
      timeout 300 python3 scripts/window_fwd_ab.py 2>&1 | grep "^|" | tee "$out/window-fwd-ab.md" ;;
    window-bwd-ab)  # D=64's backward under causal windows (0.80x FA4 at 256 keys in run 62): the shipped 128-row steps
      # (88 bytes of spills with a window) against 64-row steps (none), 2 and 3 stages
      for variant in "block_m=64" "block_m=64 num_stages=3"; do
        timeout 140 python3 scripts/bwd_design_ab.py $variant --masks causal --windows 256 1024 4096 --head-dims 64 \
          --seqlens 4096 16384 --rounds 2 2>&1 | grep "^|" | tee -a "$out/window-bwd-ab.md"
      done ;;
    varlen-zero)  # packed backwards zero only the rows past the last sequence, by one launch: their GPU tests
      # (NaN-filled buffers show a row no kernel wrote), then against the dk/dv memsets before it
      timeout 300 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_bwd.py \
        tests/kernels/portable/test_bwd.py -k "packed or varlen or rows_past" 2>&1 | grep -E "passed|failed|FAILED|Error" \
        | tee -a "$out/varlen-zero.md"
      timeout 200 python3 scripts/varlen_bwd_ab.py --compare memsets --rounds 3 2>&1 | grep "^|" | tee -a "$out/varlen-zero.md" ;;
    softcap-fwd-ab)  # the capped forward (softcap 50) at D=64, which FWD_HOPPER leaves to the portable kernel since run
      # 61 (before the GPU's tanh): the portable kernel against the sm90 entries and the 128-row candidate, causal
      for n in 4096 16384; do
        timeout 140 python3 scripts/window_fwd_ab.py --softcap 50 --windows 0 --seqlen $n 2>&1 | grep "^|" \
          | tee -a "$out/softcap-fwd-ab.md"
      done ;;
    softcap-tests)  # softcap on the sm90 kernels: the forward (every head dim, forced where dispatch takes the portable
      # kernel), the backward (the one pass at D=64 and 128, the split design at D=192 and 256), batch and packed
      timeout 300 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf tests/kernels tests/test_api.py -k softcap \
        2>&1 | tee "$out/softcap-tests-full.log" | grep -E "passed|failed|FAILED|Error" | tee "$out/softcap-tests.log" ;;
    softcap-bench)  # Gemma 2's capped scores (softcap 50) at D=64, 128 (27B) and 256: the sm90 kernels against the
      # portable ones (the path before) and FA4 (where PYTHONPATH has it), beside flashtile without a cap
      timeout 400 python3 -m flashtile.bench --backward --head-dims 64 128 256 --seqlens 4096 16384 --rounds 1 --memory-seqlens \
        --peers "flashtile (softcap 50)" "flashtile (portable, softcap 50)" "FA4 (softcap 50)" flashtile \
        --out "$out/bench-softcap" 2>&1 | grep "^|" | tee "$out/softcap-bench.log" ;;
    kept-replays)  # the forward's and the backward's replays kept by launch key (ops._FORWARD_AGAIN, _ONE_PASS): their
      # GPU tests (replays at new and old addresses, claims under CUDA graphs, the eager step), then small calls
      timeout 200 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider --tb=short -rf tests/kernels/hopper/test_fwd.py \
        tests/kernels/common tests/test_ops.py -k "replay or claims or frozen_max or graph or covers_the_common" 2>&1 \
        | grep -E "passed|failed|FAILED|Error" | tee "$out/kept-replays.log"
      timeout 150 python3 -m flashtile.bench.small_calls --out "$out/small-calls" 2>&1 | grep "^|" \
        | tee -a "$out/kept-replays.log" ;;
    bench-warmup)  # the bench's clocks (docs/perf/backward.md, "Next, from run 57"): the default warm-up against a
      # second of each peer's own step before its timing; FA4 where PYTHONPATH has it
      for w in 25 1000 25 1000; do
        timeout 140 python3 -m flashtile.bench --backward --peers flashtile FA4 cuDNN --head-dims 64 128 \
          --seqlens 1024 4096 --rounds 1 --warm-gpu 2 --warmup $w --out "$out/warmup-$w" 2>&1 | grep "^|" \
          | sed "s/^/warmup $w ms: /" | tee -a "$out/bench-warmup.log"
      done ;;
    pipeline-record)  # issue 41 item 3: the sm90 forward's timeline from Proton's records; bring the trace back
      timeout 200 python3 -m flashtile viz --pipeline --record -o "$out/pipeline.html" 2>&1 | tail -20 \
        | tee "$out/pipeline-record.log"
      cp flashtile/viz/pipeline_trace.json "$out/" 2>/dev/null
      timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider --tb=short tests/viz/test_pipeline.py 2>&1 | tail -20 \
        | tee -a "$out/pipeline-record.log" ;;
    bwd-candidate)  # a backward candidate kept as a patch (BWD_PATCH, required) on this copy of the tree: the sm90
      # backward's GPU tests with it, then its A/B against this tree's kernels/hopper (the whole folder, so that a patch
      # of common.py, bwd_dq.py or bwd_split.py counts) and against the candidates of bwd.py alone in BWD_ALSO, with
      # BWD_AB_ARGS passed on (e.g. "--head-dims 64 128 256 --rep 1000", or "--deterministic"); the patch is taken
      # back after
      patch=${BWD_PATCH:?BWD_PATCH=<a patch of the tree> bash scripts/gpu_session.sh bwd-candidate}
      rm -rf /tmp/hopper_before && cp -r flashtile/kernels/hopper /tmp/hopper_before
      others=(/tmp/hopper_before)
      for extra in ${BWD_ALSO:-}; do
        name=/tmp/$(basename "$extra" .patch | tr -- '-' '_').py
        patch -s -o "$name" flashtile/kernels/hopper/bwd.py "$extra" && others+=("$name")
      done
      if git apply "$patch" 2> "$out/bwd-candidate.log"; then
        timeout 200 python3 -m pytest -m gpu -q -n 12 -p no:cacheprovider --tb=short -rf \
          tests/kernels/hopper/test_bwd.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tee -a "$out/bwd-candidate.log"
        timeout 300 python3 scripts/bwd_hopper_ab.py --old "${others[@]}" --rounds 3 ${BWD_AB_ARGS:-} 2>&1 \
          | tee -a "$out/bwd-candidate.log"
        git apply -R "$patch"
      fi ;;
    ncu-bwd-peers)  # issue 36: the backward's kernels, ours and FA4's (PYTHONPATH with FA4, ../shared/anchors/FA4.md),
      # per-kernel sections (pipes, shared memory, issue, stalls) at the shapes in NCU_SHAPES ("d n causal" triples
      # separated by ";")
      IFS=';' read -ra shapes <<< "${NCU_SHAPES:-128 16384 0;64 2048 1}"
      for shape in "${shapes[@]}"; do
        read -r d n c <<< "$shape"; flag=""; [ "$c" = 1 ] && flag=--causal
        for peer in ${NCU_PEERS:-flashtile FA4}; do
          name=$out/bwd-$peer-d$d-n$n-c$c
          timeout 200 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
            --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats \
            -o "$name" python3 scripts/ncu_bwd.py --seqlen "$n" --head-dim "$d" $flag --peer $peer > "$name.log" 2>&1
          ncu --import "$name.ncu-rep" --page details --csv > "$name.csv" && rm -f "$name.ncu-rep"
        done
      done ;;
    bench-quick) python3 -m flashtile.bench --out "$out/bench" --seqlens 2048 4096 16384 --memory-seqlens \
                   2>&1 | grep -v '%|' | tee "$out/bench.log" ;;
  esac
done
