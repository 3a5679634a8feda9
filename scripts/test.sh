#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the op conformance suites, gradient
# checks, trybuild ui-tests, the short training runs, the GPU backend's tests on wgpu and
# the binaries built with it (`--device wgpu`), then the binaries with weights built in.
# It installs what a fresh machine lacks first, so a green run means a fresh machine
# works.
set -euo pipefail
cd "$(dirname "$0")/.."

# The wgpu backend runs on Mesa's lavapipe (a CPU Vulkan driver) where there is no GPU:
# install it and the Vulkan loader when missing. The tests fail, naming what to install,
# when no adapter is found; they are never skipped. The f16 precision's wgpu tests need
# f16 in shaders, which lavapipe has from Mesa 23 on: Debian 12's own Mesa is 22.3, so
# there lavapipe comes from bookworm-backports.
has_vulkan() {
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
        ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1
}
old_mesa() {
    local v
    v=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)
    [ -n "$v" ] && dpkg --compare-versions "$v" lt 23
}
# Ranks started by mpirun exchange through the system's MPI (the `mpi` feature): Open
# MPI's launcher and development files, and libclang for the crate's bindings.
has_mpi() {
    command -v mpirun >/dev/null && command -v mpicc >/dev/null &&
        ldconfig -p 2>/dev/null | grep -q 'libclang'
}
can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; }
updated=
apt_install() {
    [ -n "$updated" ] || { apt-get update -qq && updated=1; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
if ! has_vulkan || old_mesa; then
    if can_install; then
        from=()
        if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
            echo "deb http://deb.debian.org/debian bookworm-backports main" \
                >/etc/apt/sources.list.d/kiln-bookworm-backports.list
            from=(-t bookworm-backports)
        fi
        apt_install "${from[@]}" mesa-vulkan-drivers libvulkan1
    else
        echo "warning: no Vulkan driver with f16 found and cannot install one (needs root" \
            "and apt-get): install mesa-vulkan-drivers (Mesa 23 or later) and libvulkan1;" \
            "the wgpu tests will fail" >&2
    fi
fi
if ! has_mpi; then
    if can_install; then
        apt_install openmpi-bin libopenmpi-dev libclang-dev
    else
        echo "warning: no Open MPI or libclang and cannot install them (needs root and" \
            "apt-get): install openmpi-bin, libopenmpi-dev and libclang-dev; the build" \
            "with the mpi feature will fail" >&2
    fi
fi

# One profile (dev with optimised dependencies, see Cargo.toml), one target dir and one
# build of the workspace, with the wgpu backend on: the backend's tests on wgpu, the zoo
# on wgpu (kiln-gpu-system: fused plans against op by op, capture rules, the dynamic
# path) and the binaries with `--device wgpu` (models/tests/devices.rs) run beside
# everything else, and every crate above kiln-cubecl compiles once. MPI is on too:
# the multi-node tests run ranks under mpirun (models/tests/multi_node.rs).
export CARGO_TERM_COLOR=never
# trybuild builds its cases in a project of its own, under cargo's default dev profile
# (full debug info): 162 MB per ui pass case and 3.4 GB in all, which once filled a
# CI machine's disk. The workspace's dev profile has no debug info either, so this
# changes only trybuild's build (1.0 GB, and its build is faster).
export CARGO_PROFILE_DEV_DEBUG=false
features=(--features kiln-gpu-system/wgpu,kiln-models/wgpu,kiln-models/mpi)
cargo test --workspace "${features[@]}" --no-fail-fast "$@"

# Inference binaries with their weights built in (`kiln::embed!`, checked against the
# model when they compile): train small checkpoints into models/weights/, build the
# examples that embed them, and run them on image files and a prompt. The same backend
# features keep kiln-models' dependencies as the workspace build left them.
train() { ./target/debug/kiln-train --epochs 1 --save-every 0 "$@" >/dev/null; }
train --model mlp --dataset mnist --limit 2048 --out models/weights/mlp-mnist.safetensors
train --model cnn --dataset fashion --limit 2048 --out models/weights/cnn-fashion.safetensors
train --model gpt --batch-size 16 --limit 8192 --out models/weights/gpt-shakespeare.safetensors
./target/debug/kiln-quantize models/weights/mlp-mnist.safetensors \
    models/weights/mlp-mnist-int8.safetensors >/dev/null
cargo build -p kiln-models --features embedded-weights,wgpu,mpi --examples
cargo test -p kiln-models --features embedded-weights,wgpu,mpi --test embedded --no-fail-fast "$@"
