#!/usr/bin/env bash
# Edit-compile time of a model change, as a user meets it (issue 9, item 6):
#  1. a one-line edit of the MLP (`relu` -> `gelu` in its first layer), then a release
#     rebuild of the one-model binary (`examples/mnist_mlp.rs`: the MLP trained on
#     MNIST by the Learner) and of `kiln-train` (both zoo models, the command line, checkpoints);
#  2. a shape mistake in the MLP (`fc3` fed 1000 features), then `cargo check` of
#     kiln-models until the error shows;
#  3. a shape mistake in the GPT (a block's `down` fed `2 * D` features), then
#     `cargo check` of `kiln-generate` (which declares the tiny and the small GPT,
#     `Gpt<128, 4, 4, 128>`) until the error shows: it shows in kiln-models, where the
#     block's definition is checked at stand-in sizes, before the instances.
# The models live in kiln-models, what trains them in kiln-train (the Learner, its
# progress and curve) and the zoo's data and command line in kiln-harness, so an edit
# of a model recompiles the models, not what surrounds them.
# Each is timed `--runs` times (alternating with the original source, so every timed
# build starts from a warm build of the other side) and the median is printed as one
# parseable line. The source is restored on exit, whatever happens.
#
# Usage: bash scripts/edit_compile_time.sh [--runs N]
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --runs)
            [ $# -ge 2 ] || { echo "error: --runs takes a number" >&2; exit 2; }
            RUNS="$2"
            shift 2
            ;;
        *) echo "error: unknown argument '$1' (usage: $0 [--runs N])" >&2; exit 2 ;;
    esac
done
case "$RUNS" in
    '' | *[!0-9]* | 0) echo "error: --runs takes a whole number of at least 1, got '$RUNS'" >&2; exit 2 ;;
esac

MODEL=models/src/mlp.rs
GPT=models/src/gpt.rs
BACKUP=$(mktemp)
GPT_BACKUP=$(mktemp)
cp "$MODEL" "$BACKUP"
cp "$GPT" "$GPT_BACKUP"
trap 'cp "$BACKUP" "$MODEL"; cp "$GPT_BACKUP" "$GPT"; rm -f "$BACKUP" "$GPT_BACKUP"' EXIT

grep -q 'self.fc1(x).relu()' "$MODEL" || { echo "error: $MODEL no longer has the line this script edits" >&2; exit 1; }
grep -q 'down: Linear<{ 4 \* D }, D>' "$GPT" || { echo "error: $GPT no longer has the line this script edits" >&2; exit 1; }

now() { date +%s.%N; }
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

edit_activation() { sed -i 's/self.fc1(x).relu()/self.fc1(x).gelu()/' "$MODEL"; }
edit_shape() { sed -i 's/fc3: Linear<1024, 10>/fc3: Linear<1000, 10>/' "$MODEL"; }
edit_gpt_shape() { sed -i 's/down: Linear<{ 4 \* D }, D>/down: Linear<{ 2 * D }, D>/' "$GPT"; }
restore() { cp "$BACKUP" "$MODEL"; cp "$GPT_BACKUP" "$GPT"; }

# Times `cargo check "$@"` after `edit` (from a warm check of the original) until the
# shape error shows; fails when the check passes or fails without one.
time_check() {
    local edit="$1"
    shift
    restore
    cargo check "$@" >/dev/null 2>&1 || { echo "error: cargo check $* failed before the edit" >&2; exit 1; }
    "$edit"
    local t0 t1
    t0=$(now)
    if cargo check "$@" >/tmp/kiln_check.log 2>&1; then
        echo "error: the shape mistake ($edit) was not reported by cargo check $*" >&2
        exit 1
    fi
    t1=$(now)
    grep -q "shape mismatch" /tmp/kiln_check.log || { echo "error: cargo check $* failed without a shape error:" >&2; cat /tmp/kiln_check.log >&2; exit 1; }
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

# The two release builds the edit is timed on.
ONE_MODEL=(cargo build --release -p kiln-models --example mnist_mlp)
TRAIN=(cargo build --release -p kiln-models --bin kiln-train)

# Times one build of "$@" after the activation edit (from a warm build of the original).
time_edit() {
    restore
    "$@" >/dev/null 2>&1 || { echo "error: $* failed before the edit" >&2; exit 1; }
    edit_activation
    local t0 t1
    t0=$(now)
    "$@" >/dev/null 2>&1 || { echo "error: $* failed after the edit" >&2; exit 1; }
    t1=$(now)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

echo "# warming up the release builds and the check"
"${ONE_MODEL[@]}" >/dev/null 2>&1
"${TRAIN[@]}" >/dev/null 2>&1
cargo check -p kiln-models >/dev/null 2>&1
cargo check -p kiln-models --bin kiln-generate >/dev/null 2>&1

one_model_times=()
build_times=()
check_times=()
gpt_check_times=()
for _ in $(seq "$RUNS"); do
    # A failed build exits the subshell only: an empty time stops the script here.
    t=$(time_edit "${ONE_MODEL[@]}") && [ -n "$t" ] || exit 1
    one_model_times+=("$t")
    t=$(time_edit "${TRAIN[@]}") && [ -n "$t" ] || exit 1
    build_times+=("$t")

    t=$(time_check edit_shape -p kiln-models) && [ -n "$t" ] || exit 1
    check_times+=("$t")
    t=$(time_check edit_gpt_shape -p kiln-models --bin kiln-generate) && [ -n "$t" ] || exit 1
    gpt_check_times+=("$t")
done
restore

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "# cpu: $cpu, $(nproc) cores; commit $(git rev-parse --short HEAD)"
echo "bench=edit_rebuild target=mnist_mlp profile=release runs=$RUNS median_s=$(printf '%s\n' "${one_model_times[@]}" | median) all=${one_model_times[*]}"
echo "bench=edit_rebuild target=kiln-train profile=release runs=$RUNS median_s=$(printf '%s\n' "${build_times[@]}" | median) all=${build_times[*]}"
echo "bench=edit_check target=kiln-models runs=$RUNS median_s=$(printf '%s\n' "${check_times[@]}" | median) all=${check_times[*]}"
echo "bench=edit_check target=kiln-generate model=Gpt<128,4,4,128> runs=$RUNS median_s=$(printf '%s\n' "${gpt_check_times[@]}" | median) all=${gpt_check_times[*]}"
