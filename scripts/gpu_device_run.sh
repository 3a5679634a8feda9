#!/usr/bin/env bash
# Kiln GPU backend run on the H200: op tests and benchmarks on CUDA and Vulkan, PyTorch
# beside them. Usage: bash .device-bin/run.sh <what: all|int8|f16|attention|dropout|oom|w3step|w3profile|w3check|w3groups|w3rows|w3replay|w3one|w3tf32|flash|w3peers|w3torch|second|cuda|wgpu|torch|mnist|fused|graph|dynamic|dynreplay|hostcost|products|submitab|dynprofile|binaries|replay|same|steps|vulkan|mixed|w3train|ranks|nodes|ranksteps|ranksgraph|overlap|overlapab>
#
# .device-bin holds what the run carries: gpu_bench.xz (the stripped example
# `cargo build -p kiln-gpu-system --features wgpu,cuda --example gpu_bench`, xz-compressed),
# fused_test.xz and kernel_cache_test.xz (the stripped `cargo test -p kiln-cubecl
# --features wgpu,cuda --test fused --test kernel_cache --no-run` binaries: the
# fused-kernel tests on CUDA and Vulkan), fused_models_test.xz (`cargo test -p
# kiln-gpu-system --features wgpu,cuda --test fused_models --no-run`: models' fused
# plans against their op-by-op paths), reduce_test.xz (`--test reduce_layouts`: the
# reductions' layouts on CUDA and Vulkan), conformance_test.xz (`--test conformance_cuda`:
# the conformance suite on CUDA), cuda_graph_test.xz and capture_rules_test.xz
# (`-p kiln-gpu-system --test cuda_graph --test capture_rules`), dynamic_equal_test.xz
# (`-p kiln-gpu-system --test dynamic_equal_wgpu`: the dynamic path and a model with a dynamic part on Vulkan),
# oom_test.xz and driver_errors_test.xz (`-p kiln-cubecl --test out_of_memory_cuda
# --test driver_errors_wgpu`: filling the device on CUDA and on Vulkan),
# ncu_sum.py (scripts/: sums an `ncu --csv` dump),
# bench_gpu.py (scripts/), this script, and gl/*.deb (libvulkan1 and the glvnd
# libraries, `apt-get download`ed, as the device README says). CUDA 13 headers come
# from the machine's /usr/local/cuda, NVRTC and cuBLASLt from PyTorch's nvidia/cu13.
set -u
B=.device-bin
W=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
for x in $B/*.xz; do
  [ -x ${x%.xz} ] || python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$x'),open('${x%.xz}','wb'))" && chmod +x ${x%.xz}
done
for f in $B/gl/*.deb; do dpkg -x $f /; done; ldconfig
ls /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ 2>/dev/null | grep -qi nvidia || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
SP=$(python3 -c "import site; print(site.getsitepackages()[0])")
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
for d in /usr/local/cuda /usr/local/cuda-13.0 $SP/nvidia/cu13; do
  if [ -f $d/include/cuda_runtime.h ]; then export CUDA_PATH=$d; break; fi
done
echo "CUDA_PATH=${CUDA_PATH:-none} cccl: $(ls -d ${CUDA_PATH:-/x}/include/cccl 2>&1)"
nvidia-smi -L; date -u
run() { echo "== $*"; timeout "$@" 2>&1 | grep -v XDG_RUNTIME; }
# The binaries read their data where they were built: that path points at this tree's.
models_data() {
  M=$(sed -n 's/^kiln_models_dir=//p' $B/paths 2>/dev/null)
  [ -n "$M" ] && mkdir -p "$M" && ln -sfn "$(pwd)/models/data" "$M/data"
}
# NCCL for Kiln's ranks: PyTorch's wheel carries libnccl.so.2, Kiln loads libnccl.so.
nccl_env() {
  N=$(find $SP/nvidia -name 'libnccl.so*' 2>/dev/null | head -1)
  echo "NCCL: ${N:-none}"
  mkdir -p /tmp/nccl && [ -n "$N" ] && ln -sf "$N" /tmp/nccl/libnccl.so
  export LD_LIBRARY_PATH=/tmp/nccl:$LD_LIBRARY_PATH
}
# The tensors of two safetensors files compared bit for bit (metadata aside).
same() { python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    head.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in head.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
same = a.keys() == b.keys() and all(a[k] == b[k] for k in a)
print(f"replayed and planned {sys.argv[1].split('/')[-1]}: {len(a)} tensors, {'bit-identical' if same else 'DIFFERENT'}")
PY
}
case $W in
  tests)
    # Every carried CUDA test binary, one after the other: the backend's own (fused
    # kernel, reductions, conformance, kernel cache) and the zoo's (fused plans, capture
    # rules, CUDA graphs); what a refactor of the CUDA runtime must keep passing.
    for t in fused_test reduce_test conformance_test kernel_cache_test fused_models_test \
             capture_rules_test cuda_graph_test; do
      [ -x $B/$t ] && run 300 $B/$t --test-threads 1 2>&1 | tail -25
    done ;;
  attention)
    # Fused attention (issue 29): the conformance family on CUDA (f64, f32, bf16, f16
    # against the f64 reference, gradients included), the zoo's attention plans against
    # their op-by-op paths, the fused op against the primitives and PyTorch's
    # scaled_dot_product_attention on [32, 8, T, 64].
    [ -x $B/conformance_test ] && run 300 $B/conformance_test --test-threads 1 attention
    [ -x $B/fused_models_test ] && run 200 $B/fused_models_test --test-threads 1
    run 200 $B/gpu_bench --backend cuda --workloads attention --reps 20
    run 200 python3 scripts/bench_attention.py --reps 20 ;;
  dropout)
    # Attention dropout (issue 29): the conformance family on CUDA (dropout cases against
    # the f64 reference, the mask's statistics, draws with a seed in device memory) and
    # the capture rules (a step with attention dropout reading its seed from device
    # memory draws the host-seeded step's mask).
    [ -x $B/conformance_test ] && run 300 $B/conformance_test --test-threads 1 attention
    [ -x $B/capture_rules_test ] && run 200 $B/capture_rules_test --test-threads 1 cuda ;;
  oom)
    # Out of device memory (issue 33): CUDA's default limit refuses an allocation past
    # it, the program frees and trains on; on Vulkan, the default limit from the heap,
    # then the driver's own refusal with the limit lifted (caught by an error scope);
    # the capture rules with the limit in place.
    [ -x $B/oom_test ] && run 200 $B/oom_test --test-threads 1 --nocapture
    [ -x $B/driver_errors_test ] && run 200 $B/driver_errors_test --test-threads 1 --include-ignored --nocapture
    [ -x $B/capture_rules_test ] && run 200 $B/capture_rules_test --test-threads 1 cuda ;;
  w3step)
    # W3's step (kiln-bench, planned, f32 and bf16 products) with PyTorch's eager and
    # torch.compile steps (f32, bf16 autocast) beside it.
    models_data
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3,w3-bf16 --reps 30
    for p in f32 bf16; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 300 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3profile)
    # W3's step on CUDA (kiln-bench: planned and replayed, f32 and bf16 products), then
    # each kernel's GPU time over exactly one planned step of each (KILN_PROFILE_STEP:
    # the step inside a profiler range; ncu with the clocks left alone).
    models_data
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 30
    for c in w3-bf16 w3; do
      echo "== ncu $c (one planned step)"
      KILN_PROFILE_STEP=1 timeout 240 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
        --metrics gpu__time_duration.sum --csv $B/kiln-bench --device cuda --data models/data \
        --workloads w3 --w3-configs $c --reps 1 > "$OUT/prof-$c.csv" 2>"$OUT/prof-$c.err"
      python3 $B/ncu_sum.py "$OUT/prof-$c.csv" | head -45
    done ;;
  w3check)
    # Issue 30's changes on CUDA: the attention and scatter-add conformance families
    # (the forward pass with its statistics and the keys' and values' gradients in one
    # launch, against the ops alone and the f64 reference; an embedding's gradient by
    # rows), the fused kernels' tests (reductions of a prologue computed as they read
    # it), then the w3profile figures and PyTorch's eager and compiled W3 steps.
    [ -x $B/conformance_test ] && run 400 $B/conformance_test --test-threads 1 attention scatter
    [ -x $B/fused_test ] && run 300 $B/fused_test --test-threads 1
    bash $0 w3profile
    for p in bf16 f32; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 300 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3replay)
    # Issue 64: captured steps launch row passes (no fallback): replayed steps against
    # planned ones on CUDA, the row-pass kernel against its kernels run apart, then W3's
    # planned and replayed steps in bf16 and f32 (PyTorch's beside them: `torch` below).
    models_data
    [ -x $B/cuda_graph_test ] && run 200 $B/cuda_graph_test --test-threads 1 replayed_steps
    [ -x $B/row_pass_test ] && run 150 $B/row_pass_test --test-threads 1 cuda::
    run 240 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 20 ;;
  w3one)
    # `w3replay` and `w3torch` in one call short of device time: replayed steps against
    # planned ones, W3's planned and replayed steps, PyTorch's bf16 eager and compiled
    # steps and its compiled f32 step.
    models_data
    [ -x $B/cuda_graph_test ] && run 150 $B/cuda_graph_test --test-threads 1 replayed_steps
    run 180 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 20
    run 60 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision bf16
    for p in bf16 f32; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3tf32)
    # Issue 64, item 6's TF32 row: W3's f32 step with its products on TF32 tensor cores
    # (kiln-bench's w3-tf32) beside plain f32, and PyTorch's compiled steps with
    # `allow_tf32` on and off.
    models_data
    run 150 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-tf32,w3 --reps 20
    for p in tf32 f32; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  flash)
    # Issue 64, item 1: FlashAttention-2's kernels (fragments in registers) against the
    # f64 reference on CUDA, attention's timings beside SDPA's, then W3's steps in bf16,
    # TF32 and f32 (PyTorch's in `w3peers`, on the same warm machine).
    models_data
    [ -x $B/conformance_test ] && run 240 $B/conformance_test --test-threads 1 attention
    run 120 $B/gpu_bench --backend cuda --workloads attention --reps 20
    run 90 python3 scripts/bench_attention.py --reps 20
    run 200 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3-tf32,w3 --reps 20 ;;
  w3peers)
    # PyTorch's W3 steps beside `flash`'s: bf16 eager, compiled bf16, TF32 and f32.
    run 60 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision bf16
    for p in bf16 tf32 f32; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3torch)
    # PyTorch's W3 steps, eager and torch.compile, bf16 and f32: the peer for `w3replay`
    # on the same warm machine.
    for p in bf16 f32; do
      run 100 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3rows)
    # Issue 64, items 2 and 5: the row-pass kernel against its kernels run apart and the
    # CPU (row_pass_test: `cargo test -p kiln-cubecl --features cuda --test row_pass`),
    # the zoo's plans on CUDA against op by op, the grouped AdamW and SGD bit for bit
    # against one-by-one (fused_models_test), CUDA's fused-kernel tests where carried,
    # then W3's planned and replayed steps and PyTorch's eager and compiled steps beside.
    models_data
    [ -x $B/row_pass_test ] && run 200 $B/row_pass_test --test-threads 1 cuda::
    [ -x $B/fused_test ] && run 300 $B/fused_test --test-threads 1 cuda::
    [ -x $B/fused_models_test ] && run 400 $B/fused_models_test --test-threads 1 cuda
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 30
    # SHORT=1: torch.compile's steps only (a call short of device time).
    for p in bf16 f32; do
      [ -n "${SHORT:-}" ] ||
        run 100 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  w3groups)
    # Issue 30's multi-tensor kernel on CUDA: groups of random expressions against the
    # CPU (fused_test, kiln-cubecl's `groups_of_random_expressions_match_the_cpu`; when
    # it passes, CUDA's `KilnRuntime::GROUPS_FUSED_ELEMENTWISE` can be turned on), replayed
    # steps against planned ones, then W3 (planned, replayed; ncu of one bf16 step) and
    # PyTorch's eager and compiled W3 steps beside it (SHORT=1: bf16 PyTorch only, no ncu).
    models_data
    [ -x $B/fused_test ] && run 300 $B/fused_test --test-threads 1 cuda::groups
    [ -x $B/fused_models_test ] && run 200 $B/fused_models_test --test-threads 1 cuda_optimizers_update
    [ -x $B/cuda_graph_test ] && run 200 $B/cuda_graph_test --test-threads 1 replayed_steps_train_every_model
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 30
    if [ -n "${SHORT:-}" ]; then
      # A short call: PyTorch's bf16 W3 steps only.
      run 100 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision bf16
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision bf16 --compile
      exit 0
    fi
    echo "== ncu w3-bf16 (one planned step)"
    KILN_PROFILE_STEP=1 timeout 240 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
      --metrics gpu__time_duration.sum --csv $B/kiln-bench --device cuda --data models/data \
      --workloads w3 --w3-configs w3-bf16 --reps 1 > "$OUT/prof-w3-bf16.csv" 2>"$OUT/prof-w3-bf16.err"
    python3 $B/ncu_sum.py "$OUT/prof-w3-bf16.csv" | head -45
    for p in bf16 f32; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 300 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done ;;
  f16)
    # f16 mixed precision with dynamic loss scaling (issue 32, item 3) on CUDA and on the
    # H200's Vulkan: the fused-models tests (the f16 MLP planned against op by op and the
    # CPU, the tiny GPT's f16 loss curve against f32 with overflowing steps skipped, on
    # both backends), the small GPT's and W3's steps in f32, bf16 and f16 (kiln-bench,
    # planned; Vulkan has no bf16), and PyTorch's eager W3 steps in f32, bf16 and f16
    # (autocast, GradScaler) beside them.
    models_data
    [ -x $B/fused_models_test ] && run 400 $B/fused_models_test --test-threads 1
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 \
      --w3-configs small,small-bf16,small-f16,w3,w3-bf16,w3-f16 --reps 20
    run 300 $B/kiln-bench --device wgpu --data models/data --workloads w3 \
      --w3-configs small,small-f16,w3,w3-f16 --reps 10
    for p in f32 bf16 f16; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
    done ;;
  casts)
    # Issue 31's planner change on CUDA (casts moved across views, widening casts
    # recomputed in their readers, bf16 reshape copies into slots): the fused kernels'
    # tests, the fused-models tests (the bf16 GPT planned against op by op and the CPU),
    # replayed steps against planned ones, and W3 in f32 and bf16, planned and replayed.
    models_data
    [ -x $B/fused_test ] && run 300 $B/fused_test --test-threads 1
    [ -x $B/fused_models_test ] && run 300 $B/fused_models_test --test-threads 1
    [ -x $B/cuda_graph_test ] && run 200 $B/cuda_graph_test --test-threads 1 replayed_steps_train_every_model
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3-bf16,w3 --reps 30 ;;
  mixed)
    # Mixed precision (issue 15): the fused-kernel tests on CUDA (the bf16 MLP's fused
    # plans against its op-by-op path and the CPU), W3's training step in f32 and with
    # bf16 products (kiln-bench, planned), and PyTorch's W3 eager and torch.compile, f32
    # and bf16 autocast, in the same call.
    models_data
    [ -x $B/reduce_test ] && run 200 $B/reduce_test --test-threads 1
    [ -x $B/conformance_test ] && run 200 $B/conformance_test --test-threads 1 matmul
    [ -x $B/fused_test ] && run 300 $B/fused_test --test-threads 1
    [ -x $B/fused_models_test ] && run 300 $B/fused_models_test --test-threads 1
    run 300 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3,w3-bf16 --reps 30
    for p in f32 bf16; do
      run 150 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p
      run 300 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 10 --precision $p --compile
    done
    if [ -n "${NCU:-}" ]; then
      # About 1.5 bf16 steps past the warm-up, each kernel's GPU time.
      echo "== ncu w3-bf16"
      timeout 240 /usr/local/cuda/bin/ncu --launch-skip 4000 --launch-count 3000 \
        --metrics gpu__time_duration.sum --csv $B/kiln-bench --device cuda --data models/data --workloads w3 \
        --w3-configs w3-bf16 --reps 5 > "$OUT/w3prof.csv" 2>/dev/null
      python3 $B/ncu_sum.py "$OUT/w3prof.csv"
    fi ;;
  ranks)
    # Data parallelism through NCCL (issue 16): the NCCL tests (a group of one; with two
    # GPUs, `--ignored` adds two ranks), kiln-train's MLP with --ranks 1 against the
    # plain run (the same bits expected: an average over one rank is a copy), W3's step
    # plain, planned and as a rank through NCCL, and PyTorch's DDP of one rank beside
    # it; with two GPUs, the two-rank runs and PyTorch's DDP over two.
    # nccl_test.xz: `cargo test -p kiln-cubecl --features cuda --test nccl --no-run`.
    models_data
    nccl_env
    GPUS=$(nvidia-smi -L | wc -l)
    if [ "$GPUS" -ge 2 ]; then I=--include-ignored; else I=; fi
    [ -x $B/nccl_test ] && run 120 $B/nccl_test --test-threads 1 $I --skip an_exchange_stalled
    C="--model mlp --epochs 2 --save-every 0 --no-graph --batch-size 128"
    run 120 $B/kiln-train --device cuda $C --out "$OUT/plain.safetensors"
    run 120 $B/kiln-train --device cuda $C --ranks 1 --out "$OUT/ranks1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/ranks1.safetensors"
    W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --epochs 1 --batch-size 32 --save-every 0"
    run 150 $B/kiln-train --device cuda $W --out "$OUT/w3.safetensors"
    run 150 $B/kiln-train --device cuda $W --no-graph --out "$OUT/w3p.safetensors"
    run 150 $B/kiln-train --device cuda $W --ranks 1 --out "$OUT/w3r1.safetensors"
    for c in "" --compile; do
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 20 --precision bf16 $c
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 20 --precision bf16 --ddp $c
    done
    if [ "$GPUS" -ge 2 ]; then
      run 150 $B/kiln-train --device cuda $C --ranks 2 --batch-size 64 --out "$OUT/ranks2.safetensors"
      run 150 $B/kiln-train --device cuda $W --ranks 2 --out "$OUT/w3r2.safetensors"
      # Whether sending buckets during the backward pass pays once a link is crossed.
      KILN_OVERLAP=0 run 150 $B/kiln-train --device cuda $W --ranks 2 --out "$OUT/w3r2after.safetensors"
      run 200 python3 -m torch.distributed.run --nproc_per_node 2 scripts/gpt_torch.py bench --config w3 --reps 20 --precision bf16 --ddp --compile
    fi
    rm -f "$OUT"/*.safetensors ;;
  nodes)
    # Ranks placed by torchrun's variables and by torchrun itself (issue 37): the NCCL
    # tests, then the MLP as one plain process, as `--ranks 1` (the NCCL id through the
    # TCP meeting), as rank 0 of 1 from hand-set torchrun variables (MASTER_PORT held by
    # rank 0) and under torchrun (whose agent holds MASTER_PORT: rank 0 publishes its own
    # port in the agent's store), each the same bits as the plain run. With two GPUs:
    # the two-GPU NCCL tests, two simulated nodes of one GPU each under torchrun against
    # one GPU at the total batch, and W3 from 1 to 2 GPUs (during and after the backward
    # pass) with PyTorch's DDP over 1 and 2 beside it.
    models_data
    nccl_env
    GPUS=$(nvidia-smi -L | wc -l)
    if [ "$GPUS" -ge 2 ]; then I=--include-ignored; else I=; fi
    [ -x $B/nccl_test ] && run 120 $B/nccl_test --test-threads 1 $I --skip an_exchange_stalled
    TR="python3 -m torch.distributed.run"
    C="--model mlp --epochs 2 --save-every 0 --no-graph --batch-size 128"
    run 120 $B/kiln-train --device cuda $C --out "$OUT/plain.safetensors"
    run 120 $B/kiln-train --device cuda $C --ranks 1 --out "$OUT/ranks1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/ranks1.safetensors"
    RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 \
      run 120 $B/kiln-train --device cuda $C --out "$OUT/env1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/env1.safetensors"
    run 150 $TR --nnodes 1 --nproc-per-node 1 --master-port 29732 --no-python \
      $B/kiln-train --device cuda $C --out "$OUT/torchrun1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/torchrun1.safetensors"
    if [ "$GPUS" -ge 2 ]; then
      for node in 1 0; do
        CUDA_VISIBLE_DEVICES=$node timeout 200 $TR --nnodes 2 --nproc-per-node 1 --node-rank $node \
          --master-addr 127.0.0.1 --master-port 29733 --no-python \
          $B/kiln-train --device cuda --model mlp --epochs 2 --save-every 0 --no-graph --batch-size 64 \
          --out "$OUT/nodes2.safetensors" > "$OUT/node$node.log" 2>&1 &
      done
      wait; cat "$OUT/node0.log" "$OUT/node1.log" | grep -v "^W1"
      python3 - "$OUT/plain.safetensors" "$OUT/nodes2.safetensors" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n]); head.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
            b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in head.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
worst = max(max(abs(x - y) for x, y in zip(a[k], b[k])) / max(1e-6, max(abs(x) for x in a[k])) for k in a)
print("two nodes against one GPU at the total batch: worst relative difference %.3g" % worst)
PY
      W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --epochs 1 --batch-size 32 --save-every 0"
      run 150 $B/kiln-train --device cuda $W --out "$OUT/w3.safetensors"
      run 150 $B/kiln-train --device cuda $W --ranks 2 --batch-size 16 --out "$OUT/w3r2half.safetensors"
      run 150 $B/kiln-train --device cuda $W --ranks 2 --out "$OUT/w3r2.safetensors"
      KILN_OVERLAP=0 run 150 $B/kiln-train --device cuda $W --ranks 2 --out "$OUT/w3r2after.safetensors"
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 20 --precision bf16 --compile
      run 200 $TR --nproc_per_node 2 scripts/gpt_torch.py bench --config w3 --reps 20 --precision bf16 --ddp --compile
    fi
    rm -f "$OUT"/*.safetensors ;;
  ranksteps)
    # W3's steady step as a rank through NCCL against the same step planned: each run
    # for 1 and for 6 epochs (103 and 618 steps), so that the difference of their times
    # over 515 steps leaves out compilation and start-up.
    models_data
    nccl_env
    W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --batch-size 32 --save-every 0"
    for e in 1 6; do
      for how in --no-graph "--ranks 1" ""; do
        run 150 $B/kiln-train --device cuda $W --epochs $e $how --out "$OUT/w3.safetensors"
      done
    done
    rm -f "$OUT"/*.safetensors ;;
  ranksgraph)
    # Ranks whose NCCL exchanges are captured with the step and replayed (a CUDA graph):
    # the NCCL tests, then the MLP and W3 with --ranks 1 against the plain replayed
    # runs (the same bits expected), W3 for 1 and 6 epochs each for its steady step.
    models_data
    nccl_env
    [ -x $B/nccl_test ] && run 120 $B/nccl_test --test-threads 1
    C="--model mlp --epochs 2 --save-every 0 --batch-size 128"
    run 120 $B/kiln-train --device cuda $C --out "$OUT/plain.safetensors"
    run 120 $B/kiln-train --device cuda $C --ranks 1 --out "$OUT/ranks1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/ranks1.safetensors"
    W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --batch-size 32 --save-every 0"
    for e in 1 6; do
      run 150 $B/kiln-train --device cuda $W --epochs $e --out "$OUT/w3-$e.safetensors"
      run 150 $B/kiln-train --device cuda $W --epochs $e --ranks 1 --out "$OUT/w3r1-$e.safetensors"
    done
    same "$OUT/w3-6.safetensors" "$OUT/w3r1-6.safetensors"
    # Whether two plain runs of W3 give the same bits (what the comparison above needs).
    [ -n "${TWICE:-}" ] && run 150 $B/kiln-train --device cuda $W --epochs 6 --out "$OUT/w3-6b.safetensors" &&
      same "$OUT/w3-6.safetensors" "$OUT/w3-6b.safetensors"
    rm -f "$OUT"/*.safetensors ;;
  overlap)
    # Gradients sent while the backward pass runs (buckets on NCCL's own stream, joined
    # into the captured step) and the watchdog: the NCCL tests, then the one that stalls
    # an exchange past its timeout alone (it aborts a communicator), the MLP and W3 as a
    # rank of one against the plain replayed runs (bits, and W3's steady step from 1 and
    # 6 epochs), and PyTorch's torch.compile W3 step with and without DDP of one rank.
    models_data
    nccl_env
    [ -x $B/nccl_test ] && run 120 $B/nccl_test --test-threads 1 --skip an_exchange_stalled
    [ -x $B/nccl_test ] && run 60 $B/nccl_test --ignored --exact an_exchange_stalled_past_the_timeout_fails_the_group
    C="--model mlp --epochs 2 --save-every 0 --batch-size 128"
    run 120 $B/kiln-train --device cuda $C --out "$OUT/plain.safetensors"
    run 120 $B/kiln-train --device cuda $C --ranks 1 --out "$OUT/ranks1.safetensors"
    same "$OUT/plain.safetensors" "$OUT/ranks1.safetensors"
    W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --batch-size 32 --save-every 0"
    # Planned first: buckets on the side stream without a capture, each exchange
    # watched; it also fills the kernel cache, so that the timed runs below all start
    # warm and their 1- and 6-epoch times differ by 515 steady steps.
    run 150 $B/kiln-train --device cuda $W --epochs 1 --ranks 1 --no-graph --out "$OUT/w3p.safetensors"
    run 150 $B/kiln-train --device cuda $W --epochs 1 --out "$OUT/w3warm.safetensors" > /dev/null
    for e in 1 6; do
      run 150 $B/kiln-train --device cuda $W --epochs $e --out "$OUT/w3-$e.safetensors"
      run 150 $B/kiln-train --device cuda $W --epochs $e --ranks 1 --out "$OUT/w3r1-$e.safetensors"
    done
    [ -z "${NO_TORCH:-}" ] && for d in "" --ddp; do
      run 200 python3 scripts/gpt_torch.py bench --config w3 --device cuda --reps 20 --precision bf16 --compile $d
    done
    rm -f "$OUT"/*.safetensors ;;
  overlapab)
    # The NCCL tests (the stalled one alone), then W3's step as a rank of one with
    # gradients sent during the backward pass (side stream), after it on the compute
    # stream (KILN_OVERLAP=0, the design before the side stream), and without ranks:
    # 618 steps each, two alternating rounds from a warm kernel cache.
    models_data
    nccl_env
    [ -x $B/nccl_test ] && run 120 $B/nccl_test --test-threads 1 --skip an_exchange_stalled
    [ -x $B/nccl_test ] && run 60 $B/nccl_test --ignored --exact an_exchange_stalled_past_the_timeout_fails_the_group
    W="--model gpt-w3 --precision bf16 --optimizer adamw --lr 0.001 --warmup 20 --batch-size 32 --save-every 0"
    run 150 $B/kiln-train --device cuda $W --epochs 1 --ranks 1 --out "$OUT/w3warm.safetensors" > /dev/null
    for round in 1 2; do
      for how in plain during after; do
        echo "== round $round, 6 epochs: $how"
        case $how in
          plain) F= ;;
          during) F="--ranks 1" ;;
          after) F="--ranks 1"; export KILN_OVERLAP=0 ;;
        esac
        timeout 150 $B/kiln-train --device cuda $W --epochs 6 $F --out "$OUT/w3.safetensors" 2>&1 | grep "^trained\|gradients"
        unset KILN_OVERLAP
      done
    done
    rm -f "$OUT"/*.safetensors ;;
  w3train)
    # The fused-kernel tests on CUDA and W3's step (kiln-bench, f32 and bf16); W3
    # trained on the Shakespeare text with bf16 products (kiln-train, built with
    # `--features cuda`), then PyTorch's same model, data, windows and recipe under
    # bf16 autocast and torch.compile: held-out loss each epoch, time to 1.50 nats/byte;
    # with NCU set, the f32 step's kernels.
    models_data
    R="--lr ${LR:-0.001} --weight-decay ${WD:-0.1} --warmup 200 --epochs ${EPOCHS:-30} --batch-size 32"
    [ -x $B/fused_test ] && run 200 $B/fused_test --test-threads 1
    run 200 $B/kiln-bench --device cuda --data models/data --workloads w3 --w3-configs w3,w3-bf16 --reps 30
    run 330 $B/kiln-train --device cuda --model gpt-w3 --precision bf16 --optimizer adamw $R --out "$OUT/w3.safetensors"
    run 60 $B/kiln-generate --device cuda --checkpoint "$OUT/w3.safetensors" --prompt "ROMEO:" --bytes 200 --seed 1
    run 200 python3 scripts/gpt_torch.py train --config w3 --device cuda --precision bf16 --compile $R --target 1.5
    rm -f "$OUT"/*.safetensors
    if [ -n "${NCU:-}" ]; then
      # About 1.5 f32 steps past the warm-up, each kernel's GPU time.
      echo "== ncu w3 (f32)"
      timeout 200 /usr/local/cuda/bin/ncu --launch-skip 4000 --launch-count 3000 \
        --metrics gpu__time_duration.sum --csv $B/kiln-bench --device cuda --data models/data --workloads w3 \
        --w3-configs w3 --reps 5 > "$OUT/w3f32prof.csv" 2>/dev/null
      python3 $B/ncu_sum.py "$OUT/w3f32prof.csv"
    fi ;;
  dynamic)
    # The dynamic path: first compile in fresh processes, then static beside dynamic,
    # the #[model]-with-a-dynamic-part and dynamic-vs-static equality tests on Vulkan,
    # and PyTorch's figures for the same work.
    run 120 $B/gpu_bench --backend cuda --workloads dynamic-first --reps 10
    run 120 $B/gpu_bench --backend wgpu --workloads dynamic-first --reps 10
    run 240 $B/gpu_bench --backend cuda --workloads w1,w2,dynamic --reps 20
    run 150 $B/gpu_bench --backend wgpu --workloads w1,w2,dynamic --reps 10
    [ -x $B/dynamic_equal_test ] && run 200 $B/dynamic_equal_test --test-threads 1
    run 200 python3 $B/bench_gpu.py --reps 20 --compile ;;
  hostcost)
    # Issue 32's figures in one call, CUDA and Vulkan side by side: wgpu's product
    # kernels against f64 on Vulkan (products_test: `-p kiln-cubecl --features wgpu
    # --test products_wgpu`, f32 and f16), the kernel-cache tests on both
    # (kernel_cache_test: `--features wgpu,cuda --test kernel_cache`; thousands of queued
    # launches keep their constants), the conformance suite on Vulkan, then per backend
    # the host cost per launch (`launch`), W1 (step, pipelined, batch-1 inference), W2
    # (with ten passes queued per synchronisation) and W1's products, and PyTorch's
    # figures for the same work (`conformance` and `dynamic` in calls with more time).
    [ -x $B/products_test ] && run 60 $B/products_test --test-threads 1
    [ -x $B/kernel_cache_test ] && run 60 $B/kernel_cache_test --test-threads 1
    run 60 $B/gpu_bench --backend wgpu --workloads launch,w1,w2,products --reps 20
    run 60 $B/gpu_bench --backend cuda --workloads launch,w1,w2,products --reps 20
    run 60 $B/gpu_bench --backend wgpu --workloads launch,w1 --reps 20
    run 60 python3 $B/bench_gpu.py --reps 20 ;;
  int8)
    # Int8 weights on CUDA (issue 36): the conformance families int8 touches (matmul_int8
    # against the exact product, products, gathers, casts, embeddings, refusals;
    # conformance_test.xz), the int8 GPT beside the f32 one (gpt_int8.xz, `cargo build
    # -p kiln-models --features cuda --example gpt_int8`: the held-out loss of the small
    # GPT's seeded weights, which the CPU's run gives too, and batch-1 logits latency of
    # the small and W3 configurations), W1's batch-1 inference in f32 and int8 (kiln-bench.xz,
    # `--features cuda --bin kiln-bench`), the int8 MLP's fused plans against its
    # op-by-op path (fused_models_test.xz, `cargo test -p kiln-gpu-system --features cuda
    # --test fused_models --no-run`), and PyTorch's GPT logits (f32, bf16) in the same
    # call.
    run 300 $B/conformance_test --test-threads 1 matmul gather cast embedding bad_shapes 2>&1 | tail -40
    [ -x $B/fused_models_test ] && run 120 $B/fused_models_test --test-threads 1 cuda::int8
    run 240 $B/gpt_int8 --device cuda --data models/data --reps 50
    run 120 $B/kiln-bench --device cuda --workloads w1 --variants infer,infer-int8 --reps 50
    for c in small w3; do
      for p in f32 bf16; do
        run 120 python3 scripts/gpt_torch.py latency --config $c --device cuda --precision $p --reps 50
      done
    done
    run 120 python3 scripts/gpt_torch.py latency --config w3 --tokens 1 --device cuda --reps 50 ;;
  products)
    # wgpu's products split over K with the next step's tiles loaded during the current
    # one's arithmetic, and waits that poll before blocking (issue 32): each product of
    # W1's batch-256 step and batch-1 inference on Vulkan, split (auto) and unsplit, each
    # checked against an f64 reference; then W1 and the round trips on Vulkan with the
    # new build (gpu_bench.xz, `--features wgpu,cuda`), the same with waits that block at
    # once (--wait-spin-us 0), and the build before both (gpu_bench_prev.xz), alternating
    # twice; W2 and W4 on Vulkan; CUDA's figures for the same work in the same call.
    run 200 $B/gpu_bench --backend wgpu --workloads products --reps 10
    for i in 1 2; do
      for v in new spin0 prev; do
        echo "== $v (round $i)"
        case $v in
          new) run 150 $B/gpu_bench --backend wgpu --workloads launch,w1 --reps 20 ;;
          spin0) run 150 $B/gpu_bench --backend wgpu --wait-spin-us 0 --workloads launch,w1 --reps 20 ;;
          prev) run 150 $B/gpu_bench_prev --backend wgpu --workloads launch,w1 --reps 20 ;;
        esac | grep -v "relu_64x1024\|unfused"
      done
    done
    run 150 $B/gpu_bench --backend wgpu --workloads w2,w4 --reps 20
    run 200 $B/gpu_bench --backend cuda --workloads products,launch,w1,w2 --reps 20 ;;
  submitab)
    # The first submission after an idle wait sent after 4 tasks (doubling to 32)
    # against always 32: W1 and the launch figures on Vulkan, the new build
    # (gpu_bench.xz, `--features wgpu`) and the one before it (gpu_bench_prev.xz)
    # alternating twice.
    for i in 1 2; do
      for b in gpu_bench_prev gpu_bench; do
        echo "== $b (round $i)"
        run 150 $B/$b --backend wgpu --workloads launch,w1 --reps 20 | grep -v "4096\|unfused"
      done
    done ;;
  dynreplay)
    # Dynamic programs replayed as CUDA graphs (issue 32, item 4): kiln-dynamic's replay
    # scenarios and the dynamic MLP's training replayed against plain runs
    # (dynamic_replay_test: `-p kiln-gpu-system --features cuda --test dynamic_replay`),
    # the graph tests (a graph sent to another thread refuses to replay there), then W1's
    # step static (planned, graphed) beside dynamic with replay on and off, batch 256
    # and 4096.
    run 300 $B/dynamic_replay_test --test-threads 1
    run 300 $B/cuda_graph_test --test-threads 1
    run 300 $B/gpu_bench --backend cuda --workloads w1,w1graph,dynamic --reps 50 ;;
  binaries)
    # The user-facing binaries with --device (`cargo build -p kiln-models --features
    # cuda,wgpu --bin kiln-train --bin kiln-infer --bin kiln-generate`, stripped): they
    # read their data where they were built, so that path points at this tree's.
    models_data
    for d in cuda wgpu; do
      run 200 $B/kiln-train --device $d --epochs 2 --out "$OUT/mlp-$d.safetensors"
      run 100 $B/kiln-infer --device $d --checkpoint "$OUT/mlp-$d.safetensors" --latency-images 200
    done
    run 200 $B/kiln-train --device cuda --model cnn --dataset fashion --epochs 1 --out "$OUT/cnn-cuda.safetensors"
    run 200 $B/kiln-train --device cuda --model gpt-tiny --optimizer adamw --lr 0.01 --batch-size 32 --epochs 1 --out "$OUT/gpt-cuda.safetensors"
    run 100 $B/kiln-generate --device cuda --checkpoint "$OUT/gpt-cuda.safetensors" --bytes 80
    run 30 $B/kiln-train --device cuda:3 ;;
  replay)
    # kiln-train's automatic graph replay on CUDA: replayed and planned runs must train
    # the same parameters bit for bit.
    models_data
    run 200 $B/kiln-train --device cuda --epochs 2 --out "$OUT/graph/mlp.safetensors"
    run 200 $B/kiln-train --device cuda --epochs 2 --no-graph --out "$OUT/planned/mlp.safetensors"
    same "$OUT/graph/mlp.safetensors" "$OUT/planned/mlp.safetensors"
    [ -n "${QUICK:-}" ] && exit 0
    run 100 $B/kiln-train --device cuda --model cnn --epochs 1 --limit 4096 --out "$OUT/cnn.safetensors"
    run 100 $B/kiln-train --device cuda --optimizer adamw --lr 0.001 --epochs 1 --limit 4096 --out "$OUT/adamw.safetensors" ;;
  same|steps)
    # Every model's training step replayed on CUDA (the MLP with SGD and AdamW, the CNN
    # with dropout and batch norm, the tiny GPT): replayed and planned runs must write
    # the same tensors bit for bit; the graph tests and kiln-bench on CUDA (W1, W3
    # planned) where carried. `steps` goes on with the capture-rule tests, W1 replayed with and without cuBLASLt's
    # timed algorithm search, in f32 and TF32, PyTorch eager and graphed beside, and one
    # W1 step under ncu.
    models_data
    for m in "mlp|--limit 8192" "adamw|--optimizer adamw --lr 0.001 --limit 8192" \
             "cnn|--model cnn --limit 4096" \
             "gpt|--model gpt-tiny --optimizer adamw --lr 0.01 --batch-size 32 --limit 65536"; do
      n=${m%%|*}; a=${m#*|}
      run 150 $B/kiln-train --device cuda --epochs 1 $a --out "$OUT/graph/$n.safetensors"
      run 150 $B/kiln-train --device cuda --epochs 1 $a --no-graph --out "$OUT/planned/$n.safetensors"
      same "$OUT/graph/$n.safetensors" "$OUT/planned/$n.safetensors"
    done
    [ -x $B/cuda_graph_test ] && run 120 $B/cuda_graph_test --test-threads 1
    [ -x $B/kiln-bench ] && run 150 $B/kiln-bench --device cuda --data models/data --workloads w1,w3 --variants static,infer --w3-configs small,w3 --reps 5 ;;&
  steps)
    [ -x $B/capture_rules_test ] && run 120 $B/capture_rules_test --test-threads 1
    run 120 $B/gpu_bench --backend cuda --workloads w1graph,w1 --reps 20 --search on
    run 90 $B/gpu_bench --backend cuda --workloads w1graph --reps 20
    run 150 python3 $B/bench_gpu.py --reps 20
    echo "== ncu w1profile"
    timeout 120 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
      --metrics gpu__time_duration.sum --csv $B/gpu_bench --backend cuda \
      --workloads w1profile > "$OUT/w1prof.csv" 2>/dev/null
    python3 $B/ncu_sum.py "$OUT/w1prof.csv" ;;
  vulkan)
    # The wgpu path on the H200's Vulkan: the conformance suite (CUDA's beside, all
    # dtypes), W2, W1 and single ops (CUDA's ops beside: the per-launch cost), and the
    # binaries with --device wgpu.
    models_data
    run 150 $B/gpu_bench --backend wgpu --workloads conformance
    run 200 $B/gpu_bench --backend cuda --workloads conformance
    run 150 $B/gpu_bench --backend wgpu --workloads w2,w1,ops --reps 10
    run 100 $B/gpu_bench --backend cuda --workloads ops --reps 10
    run 150 $B/kiln-train --device wgpu --epochs 1 --out "$OUT/mlp-wgpu.safetensors"
    [ -x $B/kiln-infer ] && run 100 $B/kiln-infer --device wgpu --checkpoint "$OUT/mlp-wgpu.safetensors" --latency-images 200
    rm -f "$OUT"/*.safetensors "$OUT"/*.png ;;
  dynprofile)
    # The kernels of one warm call on the dynamic path (W2's chain, W1's step) and of
    # one static W1 step, with their GPU time.
    for w in dynprofile-w2 dynprofile-w1 w1profile; do
      echo "== ncu $w"
      timeout 150 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
        --metrics gpu__time_duration.sum --csv $B/gpu_bench --backend cuda \
        --workloads $w > "$OUT/$w.csv" 2>/dev/null
      python3 $B/ncu_sum.py "$OUT/$w.csv"
    done ;;
  second)
    run 100 $B/gpu_bench --backend wgpu --workloads w4,w2,w1,ops --reps 10
    run 150 $B/gpu_bench --backend wgpu --workloads conformance
    run 150 $B/gpu_bench --backend cuda --workloads conformance
    run 60 $B/gpu_bench --backend cuda --workloads w4 --reps 20
    run 60 python3 $B/bench_gpu.py --reps 20 ;;
  fused|all)
    [ -x $B/fused_test ] && run 200 $B/fused_test --test-threads 1
    [ -x $B/kernel_cache_test ] && run 60 $B/kernel_cache_test ;;&
  graph|all)
    [ -x $B/cuda_graph_test ] && run 120 $B/cuda_graph_test --test-threads 1
    [ -x $B/capture_rules_test ] && run 120 $B/capture_rules_test
    run 120 $B/gpu_bench --backend cuda --workloads w1graph,w1 --reps 20 ;;&
  profile|all)
    # The kernels of one steady-state W1 step (batch 256) and their GPU time.
    timeout 120 /usr/local/cuda/bin/ncu --profile-from-start off --clock-control none \
      --metrics gpu__time_duration.sum --csv $B/gpu_bench --backend cuda \
      --workloads w1profile > "$OUT/w1prof.csv" 2>/dev/null
    python3 $B/ncu_sum.py "$OUT/w1prof.csv" ;;&
  cuda|all)
    run 240 $B/gpu_bench --backend cuda --workloads conformance
    run 120 $B/gpu_bench --backend cuda --workloads w4,w2,w1,ops --reps 20 ;;&
  torch|all)
    run 150 python3 $B/bench_gpu.py --reps 20 --compile ;;&
  mnist|all)
    run 150 $B/gpu_bench --backend cuda --workloads mnist --epochs 5 --data models/data/mnist ;;&
  wgpu|all)
    run 100 $B/gpu_bench --backend wgpu --workloads w4,w2,w1,ops --reps 10
    run 120 $B/gpu_bench --backend wgpu --workloads conformance ;;
esac
date -u
