#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the op conformance suites, gradient
# checks, trybuild ui-tests and the short training runs, then the GPU backend's tests
# on wgpu and the binaries built with it (`--device wgpu`). It installs what a fresh machine lacks first, so a green run means a fresh
# machine works.
set -euo pipefail
cd "$(dirname "$0")/.."

# One profile (dev with optimised dependencies, see Cargo.toml) and one target dir.
export CARGO_TERM_COLOR=never
cargo test --workspace --no-fail-fast "$@"

# Inference binaries with their weights built in (`kiln::embed!`, checked against the
# model when they compile): train small checkpoints into models/weights/, build the
# examples that embed them, and run them on image files and a prompt.
train() { ./target/debug/kiln-train --epochs 1 --save-every 0 "$@" >/dev/null; }
train --model mlp --dataset mnist --limit 2048 --out models/weights/mlp-mnist.safetensors
train --model cnn --dataset fashion --limit 2048 --out models/weights/cnn-fashion.safetensors
train --model gpt --batch-size 16 --limit 8192 --out models/weights/gpt-shakespeare.safetensors
cargo build -p kiln-models --features embedded-weights --examples
cargo test -p kiln-models --features embedded-weights --test embedded --no-fail-fast "$@"

# The wgpu backend runs on Mesa's lavapipe (a CPU Vulkan driver) where there is no GPU:
# install it and the Vulkan loader when missing. The tests fail, naming what to install,
# when no adapter is found; they are never skipped.
has_vulkan() {
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
        ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1
}
if ! has_vulkan; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1
    else
        echo "warning: no Vulkan driver found and cannot install one (needs root and apt-get):" \
            "install mesa-vulkan-drivers and libvulkan1; the wgpu tests will fail" >&2
    fi
fi
cargo test -p kiln-cubecl --features wgpu --no-fail-fast "$@"
# The zoo's models on wgpu (fused plans against op by op, capture rules, the dynamic path).
cargo test -p kiln-gpu-system --features wgpu --no-fail-fast "$@"
# The binaries with the wgpu backend: `--device wgpu` trains and evaluates the MLP.
cargo test -p kiln-models --features wgpu --test devices --no-fail-fast "$@"
